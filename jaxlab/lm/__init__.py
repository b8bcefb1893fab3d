"""Decoder-only language models: the transformer family, attention through `jaxlab.nn.attention` (einsum,
chunked, TPU splash, GPU flash / cuDNN), Hugging Face checkpoint IO (sharded loading), the KV-cache sampler,
LoRA, SFT data (`sft_data`) and loss (`sft`), synthetic tasks (`tasks`)."""

from jaxlab.lm.hf import config_from_hf, config_to_hf, from_pretrained, load_hf_params, save_pretrained
from jaxlab.lm.model import KVCache, Transformer, TransformerConfig, count_params, flops_per_token
from jaxlab.lm.sampler import SampleOutput, generate
from jaxlab.lm import lora, sft, sft_data, tasks, tokenizer
from jaxlab.lm.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer, train_bpe
