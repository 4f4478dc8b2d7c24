"""Write a small demo corpus (sines, noise, odd lengths, 16 kHz, 44.1 kHz, stereo, corrupt, empty).

    python scripts/make_demo.py demo                      # corpus only
    python scripts/make_demo.py demo --random-model tiny  # + a seeded random tiny Mimi (offline runs)

The random model produces meaningless features; it exists so the pipeline can be exercised
without downloading kyutai/mimi.
"""

import argparse

from mimi_extract.codec.demo import random_model, write_corpus

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("out", help="directory to write the corpus into")
parser.add_argument("--random-model", metavar="DIR", help="also save a random tiny MimiModel here")
args = parser.parse_args()
for rel, what in write_corpus(args.out).items():
    print(f"{args.out}/{rel}: {what}")
if args.random_model:
    random_model().save_pretrained(args.random_model)
    print(f"random tiny Mimi (seed 0) saved to {args.random_model}")
