"""Theory-of-mind data: Hi-ToM-style stories and questions (`stories`), an independent brute-force belief
simulator (`simulator`), and the shortcut audit (`audit`). The shared types are in `types`."""
