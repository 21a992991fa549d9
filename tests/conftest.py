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
