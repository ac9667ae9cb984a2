# The two quick-start commands of the README are `make demo` and `make test`.
# Both install first (scripts/install.sh is the one install recipe; it is idempotent and fast when done).
PY ?= .venv/bin/python

.PHONY: install demo emoji test test-fast quick-bench

install:
	bash scripts/install.sh

# The main job: train the DALLE transformer on the built-in Shapes data, then generate images for a few captions.
demo: install
	bash scripts/demo.sh

# A DALLE on the built-in emoji data (about 20 minutes on 2 CPU cores), samples for unseen names, its quality.
emoji: install
	bash scripts/emoji.sh

# DALLE_LAB_SLOW_TESTS=1 includes the slow tests: several processes, kill-and-resume through the command line
test: install
	DALLE_LAB_SLOW_TESTS=1 $(PY) -m pytest -q -n 2 tests

# For development: the tests that start no training process of their own (CI runs `make test`, everything).
test-fast: install
	$(PY) -m pytest -q -n 2 tests

quick-bench: install
	$(PY) -m lab.perf.run --quick
