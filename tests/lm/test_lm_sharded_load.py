"""Loading a Hugging Face checkpoint straight onto a mesh: every device reads only its block of each
memory-mapped tensor, so the host's transient memory stays near one tensor, and the logits equal an
unsharded load."""

import json
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import mesh as mesh_lib
from jaxlab.lm import hf
from jaxlab.lm.model import TransformerConfig

pytest.importorskip("safetensors", reason="the hf extra: pip install -e '.[hf]'")

# About 360 MB of float32: embeddings and head 131 MB each, two layers of 50 MB.
CONFIG = TransformerConfig(vocab_size=32000, hidden=1024, n_layers=2, n_heads=8, n_kv_heads=4, mlp_hidden=2816,
                           tie_embeddings=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = tmp_path_factory.mktemp("big")
  rng = np.random.default_rng(0)
  abstract = hf._abstract_params(CONFIG)
  tensors = {}
  for e in hf._entries(CONFIG):
    shape = e.hf_shape(tuple(hf._get(abstract, e.path).shape))
    tensors[e.name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
  hf._write(tensors, str(path / "model.safetensors"))
  with open(path / "config.json", "w") as f:
    json.dump(hf.config_to_hf(CONFIG), f)
  largest = max(t.nbytes for t in tensors.values())
  total = sum(t.nbytes for t in tensors.values())
  return str(path), largest, total


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_load_reads_blocks_and_matches_the_unsharded_model(checkpoint):
  path, largest, total = checkpoint
  mesh = mesh_lib.make_mesh((("data", 2), ("model", 4)))
  with mesh_lib.use(mesh, "fsdp"):
    tracemalloc.start()
    params = hf.load_hf_arrays(path, CONFIG)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Host memory beyond what the loaded arrays keep: under 1.5x the largest tensor plus the model's 1/8.
    transient = peak - current
    assert transient < 1.5 * largest + total / 8, (transient, largest, total)
    big = [("embed", "embedding"), ("lm_head", "kernel"), ("layers", 0, "mlp", "up", "kernel"),
           ("layers", 1, "attn", "q", "kernel"), ("layers", 1, "mlp", "down", "kernel")]
    for p in big:
      a = hf._get(params, p)
      assert len({s.device for s in a.addressable_shards}) == 8
      assert a.addressable_shards[0].data.size * 8 == a.size, (p, a.sharding)
    model = hf.from_pretrained(path)
    tokens = np.random.default_rng(1).integers(0, CONFIG.vocab_size, size=(2, 8)).astype(np.int32)
    sharded_logits = np.asarray(jax.jit(lambda t: model(t))(tokens))
  np.testing.assert_array_equal(np.asarray(hf._get(params, ("layers", 0, "attn", "o", "kernel"))),
                                hf.load_hf_params(path, CONFIG)["layers"][0]["attn"]["o"]["kernel"])
  plain = hf.from_pretrained(path)
  assert plain.embed.embedding[...].sharding.is_fully_replicated
  np.testing.assert_allclose(sharded_logits, np.asarray(plain(jnp.asarray(tokens))), atol=1e-4)


def test_slice_reader_cuts_any_block_of_a_flattened_layout():
  """The (out, in) torch layout of an (in0, in1, out) kernel: every block of ours equals the full read's."""
  ours = np.arange(6 * 4 * 10, dtype=np.float32).reshape(6, 4, 10)
  stored = ours.reshape(24, 10).T                                # like a torch Linear from (heads, head_dim, out)
  src = hf.TensorSource({"w": stored})
  read = hf.slice_reader(src, "w", lambda t, bs: t.T.reshape(bs), ours.shape, [(2,), (0, 1)])
  for index in [(slice(0, 3), slice(None), slice(5, 10)), (slice(2, 4), slice(1, 3), slice(None)),
                (slice(None), slice(0, 2), slice(3, 4)), ()]:
    np.testing.assert_array_equal(read(index), ours[index])
