"""Test-time scaling: self-consistency votes and rates, exact MV accuracy curves, PETS trajectory allocation.

* `self_consistency`: majority / confidence-weighted votes, the self-consistency rate, exact A(k), probit fits.
* `allocation`: PETS's offline OKG allocator (Dirichlet posterior, Monte Carlo h(alpha)), uniform allocation.
* `online`: PETS's streaming policy (count-pattern buckets, calibrated probit curves, greedy budget plan).
* `simulate`: Dirichlet-mixture answer pools; `pools`: the official PETS JSONL format (read / atomic write).
* `sample_pools`: `python -m jaxlab.tts.sample_pools` samples pools from a local jaxlab LM checkpoint.
"""

from jaxlab.tts import allocation, online, pools, self_consistency, simulate
from jaxlab.tts.allocation import OKGAllocator, optimistic_gain, optimistic_gains, uniform_vote
from jaxlab.tts.online import BucketModel, calibrate, count_patterns, greedy_bucket_plan, streaming_policy
from jaxlab.tts.pools import AnswerPools, read_pools, write_pools
from jaxlab.tts.self_consistency import (majority_vote, mv_accuracy_curve, probit_fit, sc_rate, vote, vote_counts,
                                         weighted_vote)

__all__ = ["allocation", "online", "pools", "self_consistency", "simulate", "OKGAllocator", "optimistic_gain",
           "optimistic_gains", "uniform_vote", "BucketModel", "calibrate", "count_patterns", "greedy_bucket_plan",
           "streaming_policy", "AnswerPools", "read_pools", "write_pools", "majority_vote", "mv_accuracy_curve",
           "probit_fit", "sc_rate", "vote", "vote_counts", "weighted_vote"]
