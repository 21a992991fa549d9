"""The course file's deadlines, extensions and late policy (course_grader.term): the penalty
arithmetic on hand-worked cases, and every refusal naming its field."""
from __future__ import annotations

import datetime as dt

import pytest

from course_grader import term
from course_grader.term import LatePolicy, TermError, late_penalty

DAY = 86_400
LABS = ("01_roofline", "02_kv_cache")


@pytest.mark.parametrize("policy, score, seconds, penalty", [
    (LatePolicy("none"), 10, 5 * DAY, 0.0),
    (LatePolicy("percent_per_day", 10), 10, 0, 0.0),             # on time
    (LatePolicy("percent_per_day", 10), 10, 1, 1.0),             # one second late: a started day
    (LatePolicy("percent_per_day", 10), 10, DAY, 1.0),           # exactly one day
    (LatePolicy("percent_per_day", 10), 10, DAY + 1, 2.0),       # into the second day
    (LatePolicy("percent_per_day", 10, cap=25), 16, 4 * DAY, 4.0),   # 40 % capped at 25 % of 16
    (LatePolicy("percent_per_day", 10, zero_after_days=3), 16, 3 * DAY, 4.8),   # day 3: 30 %
    (LatePolicy("percent_per_day", 10, zero_after_days=3), 16, 3 * DAY + 1, 16.0),  # day 4: zero
    (LatePolicy("zero"), 7.5, 60, 7.5),
])
def test_late_penalty(policy, score, seconds, penalty):
    assert late_penalty(policy, score, seconds) == pytest.approx(penalty, abs=1e-12)


def test_late_penalty_refuses_negative_or_nan():
    with pytest.raises(ValueError, match="finite and >= 0"):
        late_penalty(LatePolicy("zero"), 1.0, -1.0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        late_penalty(LatePolicy("zero"), float("nan"), 1.0)


def _load(tmp_path, text: str, roster: str = "learner,canvas_id\nada,1\nbo,2\n") -> term.Term:
    (tmp_path / "roster.csv").write_text(roster)
    (tmp_path / "course.toml").write_text(text)
    return term.load(tmp_path / "course.toml", labs=LABS)


def test_deadlines_extensions_and_policy_are_read(tmp_path):
    t = _load(tmp_path, '''roster = "roster.csv"
[deadlines]
"01_roofline" = 2027-01-15T17:00:00+01:00
"02_kv_cache" = "2027-02-01T09:30:00Z"
[extensions]
ada = { "01_roofline" = 48 }
[late_policy]
method = "percent_per_day"
percent_per_day = 10
cap = 50
zero_after_days = 7
[similarity]
threshold = 0.9
''')
    utc = dt.timezone.utc
    assert t.deadlines == {"01_roofline": dt.datetime(2027, 1, 15, 16, 0, tzinfo=utc),
                           "02_kv_cache": dt.datetime(2027, 2, 1, 9, 30, tzinfo=utc)}
    assert t.deadline("ada", "01_roofline") == dt.datetime(2027, 1, 17, 16, 0, tzinfo=utc)
    assert t.deadline("bo", "01_roofline") == dt.datetime(2027, 1, 15, 16, 0, tzinfo=utc)
    assert t.deadline("ada", "03_scheduling") is None
    assert t.late_policy == LatePolicy("percent_per_day", 10.0, 50.0, 7)
    assert t.similarity_threshold == 0.9 and term.Term(tmp_path).similarity_threshold == 0.8   # the default


@pytest.mark.parametrize("text, field", [
    ('[deadlines]\n"01_roofline" = 2027-01-15T17:00:00\n', "[deadlines] 01_roofline: 2027-01-15T17:00:00 has no time zone"),
    ('[deadlines]\n"01_roofline" = "next friday"\n', "[deadlines] 01_roofline: not a date-time: 'next friday'"),
    ('[deadlines]\n"01_roofline" = 2027-01-15\n', "[deadlines] 01_roofline: expected a date-time with a time zone"),
    ('[deadlines]\n"07_extra" = 2027-01-15T17:00:00Z\n', "[deadlines] 07_extra: unknown lab"),
    # hostile review: dates at the ends of datetime's range raised OverflowError, not a TermError
    ('[deadlines]\n"01_roofline" = 0001-01-01T00:00:00+01:00\n',
     "[deadlines] 01_roofline: 0001-01-01T00:00:00+01:00 is out of range in UTC"),
    ('roster = "roster.csv"\n[deadlines]\n"01_roofline" = 9999-12-31T20:00:00Z\n[extensions]\nada = { "01_roofline" = 48 }\n',
     "[extensions] ada 01_roofline: the deadline with this extension is past the year 9999"),
    ('roster = "roster.csv"\n[deadlines]\n"01_roofline" = 2027-01-15T17:00:00Z\n[extensions]\ncy = { "01_roofline" = 24 }\n',
     "[extensions] cy: unknown learner (not in the roster"),
    ('[deadlines]\n"01_roofline" = 2027-01-15T17:00:00Z\n[extensions]\nada = { "01_roofline" = 24 }\n',
     "[extensions] needs a roster"),
    ('roster = "roster.csv"\n[extensions]\nada = { "01_roofline" = 24 }\n',
     "[extensions] ada 01_roofline: the lab has no deadline"),
    ('roster = "roster.csv"\n[deadlines]\n"01_roofline" = 2027-01-15T17:00:00Z\n[extensions]\nada = { "01_roofline" = -5 }\n',
     "[extensions] ada 01_roofline (hours): expected a number from 0"),
    ('[late_policy]\nmethod = "percent_per_day"\npercent_per_day = 150\n',
     "[late_policy] percent_per_day (percent): expected a number from 0 to 100, got 150"),
    ('[late_policy]\nmethod = "percent_per_day"\npercent_per_day = 10\ncap = 120\n',
     "[late_policy] cap (percent): expected a number from 0 to 100, got 120"),
    ('[late_policy]\nmethod = "halve"\n', "[late_policy] method: expected one of none, percent_per_day, zero"),
    ('[late_policy]\nmethod = "percent_per_day"\n', "method percent_per_day needs a percentage above 0"),
    ('[late_policy]\nmethod = "zero"\ngrace = 5\n', "[late_policy] has unknown field(s) ['grace']"),
    ('[similarity]\nthreshold = 0\n', "[similarity] threshold: expected a number above 0 and at most 1, got 0"),
    ('[similarity]\nthreshold = "high"\n', "[similarity] threshold: expected a number above 0 and at most 1"),
])
def test_bad_fields_are_refused_by_name(tmp_path, text, field):
    with pytest.raises(TermError) as err:
        _load(tmp_path, text)
    assert field in str(err.value)
