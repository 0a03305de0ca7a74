# The main job in one command, and the tests in a second (see README.md).
#   make demo   fresh venv + install, profile a zoo model on whatever device exists into the
#               default DB, then start the dashboard on http://127.0.0.1:$(PORT)
#   make test   the fast CPU suite (not gpu, not slow; dashboard and browser tests included) on
#               TEST_WORKERS pytest-xdist workers; CI's .ci/run adds the slow tests
# Variables: MODEL, BATCH, DB, PORT, VENV, PROFILE_FLAGS, TEST_WORKERS (e.g. make demo MODEL=resnet50 BATCH=8).

VENV ?= .venv-demo
MODEL ?= squeezenet1_1
BATCH ?= 1
DB ?= jaxcnn_profiles.sqlite
PORT ?= 8501
# Few timed calls: on a CPU the reference path is slow and the demo should start in minutes.
PROFILE_FLAGS ?= --iters 5 --warmup 1
TEST_WORKERS ?= 2
BIN := $(VENV)/bin

.PHONY: demo install profile dashboard test

demo: profile dashboard

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml .ci/install
	bash .ci/install $(VENV) --browser
	touch $@

profile: install
	$(BIN)/jaxcnn profile $(MODEL) --batch $(BATCH) --db $(DB) $(PROFILE_FLAGS)

dashboard: install
	$(BIN)/jaxcnn dashboard --db $(DB) --port $(PORT)

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not gpu and not slow"
