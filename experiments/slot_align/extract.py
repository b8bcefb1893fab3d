"""Frozen-encoder features for the full-scale SLOT-Align configs: one .npz with <domain>_x / <domain>_y arrays.

    python -m jaxlab.experiments.slot_align.extract --dataset domainnet --encoder my_pkg.clip:make_encoder \
        --checkpoint /ckpt/clip_vitb32_datacomp --out /data/domainnet_clip.npz [--data_dir DIR] [--tfds_template T]

`--encoder module:function` names a factory `function(checkpoint_path) -> encode`, where
`encode(images (b, H, W, C) uint8) -> (b, d)` features (e.g. a CLIP ViT-B/32 image tower with its
preprocessing); it runs once, frozen (`jaxlab.federated.client.extract_features`). Images come from prepared
TFDS datasets (`tfds.data_source`, never downloaded here); the per-domain TFDS names come from
`--tfds_template` (default per dataset below, with {domain} replaced; reconstructed: check the names of
your TFDS build; Office-Home needs a manual download, and USPS / SynthDigits are not in TFDS).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable, Mapping

import numpy as np

from jaxlab.errors import ConfigError
from jaxlab.federated import client

TEMPLATES = {"office_home": "office_home/{domain}", "domainnet": "domainnet/{domain}", "digits": "{domain}"}


def domain_features(sources: Mapping[str, tuple[np.ndarray, np.ndarray]], encode: Callable, batch_size: int = 256
                    ) -> dict[str, np.ndarray]:
  """{domain: (images, labels)} -> {"<domain>_x": (n, d) float32, "<domain>_y": (n,) int32} via the frozen encoder."""
  out = {}
  for dom, (images, labels) in sources.items():
    out[f"{dom}_x"] = client.extract_features(encode, images, batch_size)
    out[f"{dom}_y"] = np.asarray(labels, np.int32)
  return out


def load_encoder(spec: str, checkpoint: str) -> Callable:
  """`module:function` -> function(checkpoint)."""
  if ":" not in spec:
    raise ConfigError(f"--encoder {spec!r} must look like package.module:factory")
  mod, fn = spec.split(":", 1)
  return getattr(importlib.import_module(mod), fn)(checkpoint)


def main(argv=None):
  from jaxlab.data.tfds import TfdsSource  # pylint: disable=g-import-not-at-top
  from . import config as config_lib
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--dataset", required=True, choices=sorted(config_lib.DATASETS))
  p.add_argument("--encoder", required=True)
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--data_dir", default=None)
  p.add_argument("--split", default="train")
  p.add_argument("--tfds_template", default=None)
  p.add_argument("--batch_size", type=int, default=256)
  a = p.parse_args(argv)
  encode = load_encoder(a.encoder, a.checkpoint)
  template = a.tfds_template or TEMPLATES[a.dataset]
  sources = {}
  for dom in config_lib.DATASETS[a.dataset][0]:
    src = TfdsSource(template.format(domain=dom.lower()), a.split, a.data_dir, keys=("image", "label"))
    rows = src[np.arange(len(src))]
    sources[dom] = (rows["image"], rows["label"])
  np.savez(a.out, **domain_features(sources, encode, a.batch_size))
  print(f"wrote {a.out}")
  return 0


if __name__ == "__main__":
  from jaxlab import cli  # pylint: disable=g-import-not-at-top
  cli.main_wrapper(main)
