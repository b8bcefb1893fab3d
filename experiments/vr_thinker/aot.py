"""VR-Thinker's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/vr_thinker/config.py:full \
        [--config.model.hf_path=DIR --config.model.vision_path=DIR]

The full variant composes a VLM from a user's decoder and vision-tower checkpoints (`train.model_config`):
their config.json files (no weights are read) give it; without them the shape of Llama 3.2 1B stands in for
the decoder and SigLIP base/16 at 224 pixels (`SIGLIP_BASE_224`, 196 visual tokens per frame) for the tower.

Target `grpo_update`: the policy update `trainers.grpo` jits (`make_train_step` over `make_grpo_loss_fn`, the
optimizer over train.num_steps x num_iterations updates) on the largest rollout batch a step can produce: under
the memory window each turn is its own training row, so train.batch_size prompts x grpo.num_generations
trajectories x data.max_turns turns, padded to eval.row_bucket, each row data.seq_len + 1 tokens wide
(`train._Run.width`) with its pair's 2 x data.frames frames (float32, as `vision_tower.preprocess` gives them;
the VLM's forward runs every frame of the row through the tower) and the reference log-probs (beta > 0).

Left out: the multi-turn rollout sampler (`VisionLM.bind` per turn, then the KV-cache sampler on contexts whose
lengths and count change from turn to turn) and the log-prob passes (forwards of the update's batch).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab.encoders.vision_tower import VisionTowerConfig
from jaxlab.lm.vlm import VisionLM, VLMConfig

from . import config as config_lib

TOPOLOGY = "v5p-64"   # 1536 rows of 16385 tokens and 192 frames a step (config.py: full)

# google/siglip-base-patch16-224's vision_config (transformers' SiglipVisionConfig defaults).
SIGLIP_BASE_224 = {"model_type": "siglip_vision_model", "hidden_size": 768, "intermediate_size": 3072,
                   "num_hidden_layers": 12, "num_attention_heads": 12, "patch_size": 16, "image_size": 224,
                   "num_channels": 3, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}


def model_config(config) -> VLMConfig:
  """The composed VLM as `train.model_config` builds it (the decoder from `compile_check.lm_model_config`)."""
  m = config.model
  dec = compile_check.lm_model_config(config)
  vis = VisionTowerConfig.from_hf(m.vision_path or SIGLIP_BASE_224)
  return VLMConfig(decoder=dec, vision=vis, image_token_base=dec.vocab_size,
                   max_images=config_lib.task(config).num_images, remat_vision=bool(m.remat))


def compile_targets(config):
  """GRPO's update on the largest rollout batch of one step."""
  vcfg = model_config(config)
  g, d = config.grpo, config.data
  model_fn = lambda rngs: VisionLM(vcfg, rngs=rngs)  # noqa: E731
  rows = int(config.train.batch_size) * int(g.num_generations) * int(d.max_turns)
  width = int(d.seq_len) + 1
  v = vcfg.vision
  images = ((vcfg.max_images, v.image_size, v.image_size, v.num_channels), jnp.float32)
  train = compile_check.grpo_target(config, config_lib.grpo_config(config), model_fn, rows, width,
                                     float(g.temperature), {"images": images},
                                     row_bucket=int(config.eval.row_bucket))
  params = train.state.params
  n_dec, n_vis = (compile_check.num_params(compile_check.Target("", None, (), state=params[k]))
                  for k in ("decoder", "vision"))
  n_proj = compile_check.num_params(compile_check.Target("", None, (), state=params["projector"]))
  dec, vis_tokens = vcfg.decoder, rows * vcfg.max_images * v.num_tokens
  # forward + backward: decoder 6 N per row token + attention; tower 6 N per patch token + attention, and the
  # projector 6 N per visual token, over every frame of every row
  train.model_flops = (compile_check.transformer_flops(n_dec, rows * width, dec.n_layers, width, dec.hidden)
                       + compile_check.transformer_flops(n_vis, vis_tokens, v.num_hidden_layers, v.num_tokens,
                                                         v.hidden_size)
                       + 6.0 * n_proj * rows * vcfg.max_images * vcfg.tokens_per_image)
  return [train]
