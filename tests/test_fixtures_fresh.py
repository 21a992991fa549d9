"""The generated submissions are committed (instructors browse them; the grading tests read them)
but never edited by hand: each must equal a fresh build from the labs' tables and the solutions.
`make samples` rebuilds both folders."""
from course_grader import hostile, samples


def test_samples_and_expected_scores_match_the_tables():
    assert samples.stale() == [], "autograder/samples/ is stale: run `make samples`"


def test_hostile_submissions_match_a_fresh_build():
    assert hostile.stale() == [], "autograder/hostile/ is stale: run `make hostile` (or `make samples`)"
