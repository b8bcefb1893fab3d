"""Theory-of-mind data: Hi-ToM-style stories and questions (`stories`), an independent brute-force belief
simulator (`simulator`), the shortcut audit (`audit`), and a word-level tokenizer with canonical names for the
symbolic renderings (`tokens`). The shared types are in `types`."""
