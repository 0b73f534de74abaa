# veil serve with Python's GIL switch interval at its default 5 ms (before = 400bfe7) and at
# 0.5 ms (after = 0299f4c): the tiny model (../2026-12-02-served/tiny_hf.py), 256 requests of
# issue 22's shape, at concurrency 256 (256 sequences per step) and 64, two rounds alternated.
COMMITS="400bfe7 0299f4c" bash ../2026-12-02-served-stack/run.sh
