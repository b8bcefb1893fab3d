"""The vision-language model (`jaxlab.lm.vlm`): visual tokens by id against an independent extended-vocabulary
decoder, text parity, bound sampling = the uncached forward, zero gradients at context positions, no bank in the
module state, composition from local checkpoints, and per-row images through the post-training stack."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.encoders.vision_tower import VisionTower, VisionTowerConfig, save_hf
from jaxlab.lm import hf, sft
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.sampler import generate
from jaxlab.lm.vlm import VisionLM, VLMConfig
from jaxlab.posttrain.grpo import GRPOConfig, make_grpo_loss_fn
from jaxlab.state import ModelDef

V = 48


def _cfg(tie=False):
  dec = TransformerConfig(vocab_size=V, hidden=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64,
                          max_position=64, tie_embeddings=tie)
  vis = VisionTowerConfig(arch="siglip", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, patch_size=4, image_size=8, num_channels=1, layer_norm_eps=1e-6,
                          hidden_act="gelu_pytorch_tanh")
  return VLMConfig(decoder=dec, vision=vis, image_token_base=V, max_images=3)


def _images(b=2, seed=0):
  return np.random.default_rng(seed).normal(size=(b, 3, 8, 8, 1)).astype(np.float32)


def _tokens(cfg):
  return np.array([[1, 2] + cfg.image_tokens(2) + [5, 6, 7] + cfg.image_tokens(0),
                   [3] + cfg.image_tokens(1) + [7, 8, 9, 10, 11, 12, 13, 14]], np.int32)


# Forwards and gradients run under `nnx.jit`: one compiled program per call instead of one per eager op.
_fwd = nnx.jit(lambda m, toks, images: m(toks, images=images))
_plain = nnx.jit(lambda m, toks: m(toks))


def _load(module, params):
  st = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(st, params)
  nnx.update(module, st)


def test_visual_tokens_equal_an_extended_vocabulary_decoder():
  """Row b's logits equal those of a plain decoder whose embedding table is the text table followed by the
  row's projected visual tokens (an independent way to place them)."""
  cfg = _cfg()
  m = VisionLM(cfg, rngs=nnx.Rngs(0))
  imgs, toks = _images(), _tokens(cfg)
  got = np.asarray(_fwd(m, toks, imgs))
  feats = m.vision(jnp.asarray(imgs.reshape(6, 8, 8, 1)))
  bank = np.asarray(m.projector(feats)).reshape(2, 3 * cfg.tokens_per_image, -1)
  params = ModelDef.split(m.decoder)[0]
  ext = Transformer(cfg.decoder.replace(vocab_size=V + bank.shape[1]), rngs=nnx.Rngs(1))
  for b in range(2):
    p = jax.tree.map(np.asarray, params)
    p["embed"]["embedding"] = np.concatenate([p["embed"]["embedding"], bank[b]])
    p["lm_head"]["kernel"] = np.concatenate([p["lm_head"]["kernel"], np.zeros((32, bank.shape[1]), np.float32)], 1)
    _load(ext, p)     # every parameter replaced: row b's extended decoder
    want = np.asarray(_plain(ext, toks[b:b + 1]))[0, :, :V]
    np.testing.assert_allclose(got[b], want, atol=2e-5)


def test_text_tokens_match_the_plain_decoder_and_no_bank_stays_in_the_state():
  cfg = _cfg(tie=True)
  m = VisionLM(cfg, rngs=nnx.Rngs(0))
  plain = Transformer(cfg.decoder, rngs=nnx.Rngs(0))
  _load(plain, ModelDef.split(m.decoder)[0])
  toks = np.arange(1, 21, dtype=np.int32).reshape(2, 10)
  want = np.asarray(_plain(plain, toks))
  np.testing.assert_allclose(np.asarray(_fwd(m, toks, _images())), want, atol=1e-6)
  np.testing.assert_allclose(np.asarray(_plain(m, toks)), want, atol=1e-6)
  md = ModelDef(lambda r: VisionLM(cfg, rngs=r))
  params, state = md.init(jax.random.key(0))
  assert state == {} and "bank" not in str(jax.tree_util.tree_structure(params))
  def fwd(p):    # a train step splits the module back after the forward: no bank may be left in it
    mm = md.merge(p, state)
    return mm(toks, images=_images()).sum(), md.split(mm)[1]
  _, after = jax.jit(fwd)(params)
  assert after == {}


def test_bound_sampling_equals_the_uncached_forward():
  cfg = _cfg()
  m = VisionLM(cfg, rngs=nnx.Rngs(2))
  imgs, toks = _images(seed=3), _tokens(cfg)
  bound = m.bind(imgs)
  assert isinstance(bound, Transformer) and m.decoder.embed.bank is None
  prompts = [list(toks[0, :9]), list(toks[1, :6])]
  out = generate(bound, prompts, 5, temperature=0.0)
  for b, p in enumerate(prompts):
    seq = p + [int(t) for t in np.asarray(out.tokens[b, :4])]
    logits = np.asarray(_fwd(m, np.asarray([seq]), imgs[b:b + 1]))[0]
    np.testing.assert_array_equal(np.argmax(logits[len(p) - 1:], -1), np.asarray(out.tokens[b]))


def test_context_positions_get_exactly_zero_gradient_and_the_tower_trains():
  """d loss / d logits is exactly 0 where loss_mask is 0 (prompt, observations), for the SFT and GRPO losses;
  the visual tokens' embeddings still get gradients through the bank (tower and projector parameters)."""
  cfg = _cfg()
  m = VisionLM(cfg, rngs=nnx.Rngs(0))
  imgs, toks = _images(), _tokens(cfg)
  mask = (toks < V).astype(np.float32)
  mask[:, :3] = 0
  logits = _fwd(m, toks, imgs)
  targets = np.where(toks < V, toks, 0)
  g = jax.grad(lambda lg: sft.sft_loss(lg, targets, mask)[0])(logits)
  assert float(jnp.abs(g)[mask == 0].max()) == 0.0 and float(jnp.abs(g)[mask > 0].max()) > 0
  loss_fn = make_grpo_loss_fn(GRPOConfig(num_generations=2, beta=0.0))
  batch = {"tokens": toks, "positions": np.broadcast_to(np.arange(toks.shape[1]), toks.shape),
           "segment_ids": np.ones_like(toks), "loss_mask": mask, "advantages": np.array([1.0, -1.0], np.float32),
           "images": imgs}
  grads = nnx.jit(nnx.grad(lambda mm: loss_fn(mm, batch, None)[0]))(m)
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(nnx.state(grads.vision, nnx.Param))) > 0
  assert float(jnp.abs(grads.projector.fc1.kernel[...]).max()) > 0


def test_composed_from_local_checkpoints(tmp_path):
  cfg = _cfg(tie=True)
  dec = Transformer(cfg.decoder, rngs=nnx.Rngs(4))
  hf.save_pretrained(dec, str(tmp_path / "dec"))
  tower = VisionTower(cfg.vision, rngs=nnx.Rngs(5))
  save_hf(str(tmp_path / "vis"), cfg.vision, tower.hf_params())
  m = VisionLM(cfg, rngs=nnx.Rngs(0), vision=VisionTower.from_pretrained(str(tmp_path / "vis")),
               decoder=hf.from_pretrained(str(tmp_path / "dec")))
  toks = np.arange(1, 11, dtype=np.int32)[None]
  np.testing.assert_allclose(np.asarray(_plain(m, toks)), np.asarray(_plain(dec, toks)), atol=1e-5)
  imgs = _images(1)
  np.testing.assert_allclose(np.asarray(m.vision(imgs[0])), np.asarray(tower(imgs[0])), atol=1e-5)


def test_bad_inputs():
  cfg = _cfg()
  m = VisionLM(cfg, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="images must be"):
    m(_tokens(cfg), images=_images()[:, :2])
  with pytest.raises(ValueError, match="image index"):
    cfg.image_tokens(3)
  bound = m.bind(_images(1))
  with pytest.raises(ValueError, match="bank has 1 rows"):
    bound(_tokens(cfg))
