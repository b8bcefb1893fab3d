"""`pytest -m slow`: every experiment's claims, as `python -m jaxlab.reproduce <paper>` checks them."""

import pytest

from jaxlab import registry, reproduce

# Experiments with a claim that honestly does not reproduce at small scale (their README gives the numbers and
# the diagnosis; README.md's results table says FAIL). Strict xfail: once every claim passes the test fails
# (XPASS), so this list and the READMEs must be updated.
NOT_REPRODUCED = {
    "df_mamba": "zero-shot length transfer (claim longer_helps) fails; see its README",
    "focus_dilution": ("the cycle claim (>= 10 of 12 fresh chains with the whole cycle, trained W_V) fails: 3/12; "
                       "S1 and control pass (5/6); see its README"),
    "latent_forcing": ("claims v2 (MNIST): the ordering gap is not larger with the semantic latent than with the "
                       "8x8 thumbnail (semantic_gap lower bound -0.114, not > 0); 3/4 pass; see its README"),
    "moe_calibration": ("claim 3's robust_cut fails: Robust MoE's worst-shift ECE is 1.36x MoCaE's, not <= 0.7x "
                        "(7/8 pass); see its README"),
    "polyphonia": ("claims v2: Polyphonia's timbre accuracy does not beat the strongest baseline (SDEdit; lower "
                   "bound -0.248) and the oracle prior misses non-inferiority by 0.3 points (-0.053 vs -0.05); 3/5 "
                   "pass; see its README"),
    "sc_milp": ("upstream_gain (+1.9 points, not +3; its bootstrap interval is above 0) and small_data_gain (+1.6, "
                "not +3) fail, 2/4 pass; see its README"),
    "taskloom_agent": ("claims v2: one seed of ten balances at 0.73x PD (not >= 0.8 on every seed), grouped vs "
                       "independent agents' AUC interval low end -33.5 (not > 0), the grouping exact on 5 of 10 "
                       "seeds (not more than half); 2/5 pass; see its README"),
    "tom_rft": ("v2 4/11 pass (the shortcut audit, the base's order 0); blocked at the competence gate: the cold "
                "starts answer the real location on order-1 false beliefs (0.08-0.20 of >= 0.4), so no arm ran; "
                "see its README"),
}


def _params():
  for name in registry.names():
    marks = [pytest.mark.xfail(reason=NOT_REPRODUCED[name], strict=True)] if name in NOT_REPRODUCED else []
    yield pytest.param(name, marks=marks, id=name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_params()))
def test_claims_pass(name, tmp_path):
  res = reproduce.reproduce(name, out=str(tmp_path), write_ledger=False)
  failed = [c for c in res["claims"] if c["passed"] is False]   # None: needs an accelerator, not checked here
  assert not failed, reproduce.format_table([res])
