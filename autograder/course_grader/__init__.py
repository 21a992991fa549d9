"""The course's grader: learner notebooks graded by stock nbgrader, in a sandbox, under a judge.

Modules (each runnable with ``python -m course_grader.NAME`` where it has a command line):

    config         the nbgrader settings ``autograder/nbgrader_config.py`` applies
    grade          the driver: a folder of submissions -> grades.csv and feedback, in parallel
    sandbox        bubblewrap kernels for learner code (no network, caps, a scratch view)
    judge          reruns every checker call outside the learner's kernel
    remote         the judge's wire protocol (plain data, both sides; the kernel side runs
                   inside the sandbox, which sees this package read-only)
    preprocessors  nbgrader preprocessors: stderr handling, restored tests, redacted feedback
    samples        builds autograder/samples/ (the solution, the release, one per fault)
    hostile        builds and checks autograder/hostile/ (cheats, crashes, escapes)
    bench          stock serial nbgrader against the parallel driver, timed

Importing the package imports nothing heavy; ``course_lib`` is imported by the modules
that need it, when they need it.
"""
