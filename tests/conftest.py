"""Session set-up for the test suite.

Under pytest-xdist (``make test-fast`` runs ``-n auto``) every worker computes on one thread. PyTorch's
default is one thread per core in each worker, so N workers would run N x cores OpenMP threads that
spin while they wait for each other: on the 2-core machine a toy-model test that takes 0.25 s alone
took 12 s with two workers on two threads each.
"""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the processes a test starts (kernels, nbgrader, the sandbox) inherit one thread each too
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    import torch

    torch.set_num_threads(1)


# `make test-lib` runs `-n 2 --dist loadgroup`: tests are spread one by one over the workers, except
# that the tests sharing an expensive module-scoped fixture stay on one worker (the fixture is built
# once). Such a module's tests form one group; test_notebook_run's form one group per lab, since its
# fixture executes one release notebook per parameter.
GROUPED_MODULES = {"test_notebook_run": "executed", "test_grading_pipeline": None, "test_hub_exchange": None,
                   "test_judge": None, "test_jupyter_env": None, "test_contract_messages": None,
                   "test_artifacts": None, "test_grading_cluster": None}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        module = item.module.__name__.rpartition(".")[2] if getattr(item, "module", None) else ""
        if module not in GROUPED_MODULES:
            continue
        fixture = GROUPED_MODULES[module]
        callspec = getattr(item, "callspec", None)
        suffix = f"[{callspec.params[fixture]}]" if fixture and callspec and fixture in callspec.params else ""
        item.add_marker(pytest.mark.xdist_group(module + suffix))
