"""Grades to the LMS (course_grader.lms, course_grader.term): the Canvas import CSV and the plain
gradebook from a grades.csv, the roster's refusals, and the upload through the real canvasapi
package against a local stub server that speaks the four endpoints it calls."""
from __future__ import annotations

import csv
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from course_grader import lms, term

GRADES = """learner,lab,score,max_score,error,seed,judge_flags,flags,sandbox
ada,01_roofline,16,16,,1,,,bubblewrap
ada,02_kv_cache,27.5,30,,2,,,bubblewrap
"bo, jr",01_roofline,0,16,not submitted,3,,,bubblewrap
NA,01_roofline,13,16,,4,,renamed notebook,bubblewrap
zed,01_roofline,9,16,,5,,,bubblewrap
"""
ROSTER = """learner,canvas_id,name,sis_user_id,sis_login_id,section
ada,101,"Lovelace, Ada",S1,ada@x,A
"bo, jr",102,Bo Jr,S2,bo@x,A
NA,103,Nadia,S3,na@x,B
"""
COURSE = """roster = "roster.csv"
[lms]
url = "{url}"
course_id = 7
token_env = "TEST_CANVAS_TOKEN"
[lms.assignments]
"01_roofline" = {{ id = 11, name = "Lab 1" }}
"02_kv_cache" = {{ id = 12, name = "Lab 2" }}
"""


def _course(tmp: Path, url: str = "https://canvas.example.edu", course: str = COURSE, roster: str = ROSTER) -> Path:
    (tmp / "grades.csv").write_text(GRADES)
    (tmp / "roster.csv").write_text(roster)
    (tmp / "course.toml").write_text(course.format(url=url))
    return tmp / "course.toml"


def _rows(path: Path) -> list[list[str]]:
    return list(csv.reader(path.open()))


def test_exports_canvas_and_plain_gradebooks(tmp_path, capsys):
    course = _course(tmp_path)
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(course)]) == 0
    canvas = _rows(tmp_path / "canvas_gradebook.csv")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 1 (11)", "Lab 2 (12)"]
    assert canvas[1] == ["Points Possible", "", "", "", "", "16", "30"]
    # sorted by name; a learner with no submission of a lab gets an empty cell (Canvas leaves it unchanged)
    assert canvas[2:] == [["Bo Jr", "102", "S2", "bo@x", "A", "0", ""],
                          ["Lovelace, Ada", "101", "S1", "ada@x", "A", "16", "27.5"],
                          ["Nadia", "103", "S3", "na@x", "B", "13", ""]]
    plain = _rows(tmp_path / "gradebook.csv")
    assert plain[0] == ["learner", "lab", "score", "max_score", "late", "flags", "error"]
    by_key = {(r[0], r[1]): r for r in plain[1:]}
    assert by_key[("NA", "01_roofline")][2:] == ["13", "16", "", "renamed notebook", ""]
    # zed is graded but not in the roster: an error row, never dropped, and listed at the end
    assert by_key[("zed", "01_roofline")][2:] == ["9", "16", "", "", lms.NOT_IN_ROSTER]
    out = capsys.readouterr().out
    assert "1 row(s) to look at" in out and "zed / 01_roofline: not in the roster" in out


def _refused(tmp_path, capsys, args, *, course=COURSE, roster=ROSTER, env=None, monkeypatch=None) -> str:
    cfg = _course(tmp_path, course=course, roster=roster)
    if monkeypatch is not None:
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(cfg), *args]) == 2
    assert not (tmp_path / "gradebook.csv").exists() and not (tmp_path / "canvas_gradebook.csv").exists()
    return capsys.readouterr().err


def test_formula_cells_of_the_roster_are_quoted_and_infinite_scores_refused(tmp_path, capsys):
    """Hostile review: a display name such as =cmd|' /C calc'!A0 went into canvas_gradebook.csv as is (a
    spreadsheet opening it runs it); a score of inf or 1e999 in a tampered grades.csv went to Canvas as 'inf'."""
    course = _course(tmp_path, roster=ROSTER + "zed,104,=cmd|' /C calc'!A0,@S4,+z@x,-B\n")
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(course)]) == 0
    assert ["'=cmd|' /C calc'!A0", "104", "'@S4", "'+z@x", "'-B", "9", ""] in _rows(tmp_path / "canvas_gradebook.csv")
    for bad in ("inf", "-1e999"):
        (tmp_path / "grades.csv").write_text(GRADES.replace("zed,01_roofline,9,", f"zed,01_roofline,{bad},"))
        with pytest.raises(term.TermError, match=f"score of 'zed' / '01_roofline' is not a finite number: '{bad}'"):
            lms.read_grades(tmp_path / "grades.csv")


@pytest.mark.parametrize("roster, field", [
    ("learner,name\nada,Ada\n", "missing column(s) ['canvas_id']"),
    ("learner,canvas_id,email\nada,1,a@x\n", "unknown column(s) ['email']"),
    ("learner,canvas_id\nada,1\nada,2\n", "learner 'ada' is listed twice"),
    ("learner,canvas_id\nada,x1\n", "canvas_id of 'ada' must be a positive integer"),
    ("learner,canvas_id\nada,\u00b2\n", "canvas_id of 'ada' must be a positive integer"),   # int('²'): ValueError
    ("learner,canvas_id\nada,\uff11\uff12\n", "canvas_id of 'ada' must be a positive integer"),   # fullwidth 12
    ("learner,canvas_id\nada,5\nbo,5\n", "canvas_id 5 is also the id of 'ada'"),
])
def test_bad_roster_is_refused_by_name_and_nothing_written(tmp_path, capsys, roster, field):
    assert field in _refused(tmp_path, capsys, [], roster=roster)


@pytest.mark.parametrize("course, field", [
    ('roster = "roster.csv"\n[lms]\nurl = "https://c"\ncourse_id = "7"\n', "[lms] course_id: expected a positive integer"),
    ('roster = "roster.csv"\n[lms]\nurl = "c.edu"\ncourse_id = 7\n', "[lms] url: expected an http(s) address"),
    # hostile review: an http:// site got the API token in clear text
    ('roster = "roster.csv"\n[lms]\nurl = "http://canvas.example.edu"\ncourse_id = 7\n',
     "[lms] url: 'http://canvas.example.edu' would send the API token unencrypted; use https://"),
    ('roster = "roster.csv"\n[lms]\nurl = "https://c"\ncourse_id = 7\n[lms.assignments]\n"09_x" = {{ id = 1 }}\n',
     "[lms.assignments] 09_x: unknown lab"),
    ('roster = "roster.csv"\ndeadline = 3\n', "unknown section(s) or field(s) ['deadline']"),
    ('roster = "roster.csv"\n[lms\n', "not a valid TOML file"),
])
def test_bad_course_file_is_refused_by_field(tmp_path, capsys, course, field):
    assert field in _refused(tmp_path, capsys, [], course=course)


def test_canvas_without_an_assignment_for_a_graded_lab_is_refused_before_writing(tmp_path, capsys):
    course = COURSE.replace('"02_kv_cache" = {{ id = 12, name = "Lab 2" }}\n', "")
    assert "no Canvas assignment for 02_kv_cache" in _refused(tmp_path, capsys, ["--canvas"], course=course)


def test_send_without_a_token_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TEST_CANVAS_TOKEN", raising=False)
    assert "TEST_CANVAS_TOKEN is empty" in _refused(tmp_path, capsys, ["--canvas", "--send"])


class _StubCanvas(BaseHTTPRequestHandler):
    """Canvas's endpoints as canvasapi calls them: the course, an assignment, the bulk grade update
    (form-encoded grade_data[USER][posted_grade]) and the Progress it returns, queued once."""
    posts: list = []
    polls: dict = {}

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer sekrit":
            return self._json(401, {"errors": [{"message": "Invalid access token."}]})
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:3] == ["api", "v1", "courses"] and len(parts) == 4 and parts[3] == "7":
            return self._json(200, {"id": 7, "name": "LLM inference"})
        if parts[:3] == ["api", "v1", "courses"] and len(parts) == 6 and parts[4] == "assignments":
            if parts[5] in ("11", "12"):
                return self._json(200, {"id": int(parts[5]), "course_id": 7, "name": f"Lab {parts[5]}"})
            return self._json(404, {"errors": [{"message": "The specified resource does not exist."}]})
        if parts[:3] == ["api", "v1", "progress"]:
            return self._json(200, {"id": int(parts[3]), "workflow_state": "completed"})
        return self._json(404, {"errors": [{"message": "not stubbed"}]})

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        form = urllib.parse.parse_qs(body)
        type(self).posts.append((parts[5], {k: v[0] for k, v in form.items()}))
        self._json(200, {"id": len(type(self).posts), "workflow_state": "queued"})


@pytest.fixture
def stub_canvas(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    _StubCanvas.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubCanvas)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_dry_run_contacts_nothing(tmp_path, capsys, stub_canvas):
    course = _course(tmp_path, url=stub_canvas)
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(course), "--canvas"]) == 0
    assert _StubCanvas.posts == []
    out = capsys.readouterr().out
    assert "dry run: would send 3 grade(s) of 01_roofline" in out and "assignment 11 (Lab 1)" in out
    assert "  Canvas user 101: 16\n" in out and "  Canvas user 102: 0\n" in out   # who would get what


@pytest.mark.filterwarnings("ignore:Canvas may respond unexpectedly")
def test_send_posts_each_lab_to_its_assignment(tmp_path, capsys, stub_canvas, monkeypatch):
    course = _course(tmp_path, url=stub_canvas)
    monkeypatch.setenv("TEST_CANVAS_TOKEN", "sekrit")
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(course), "--canvas", "--send"]) == 0
    posts = dict(_StubCanvas.posts)
    assert set(posts) == {"11", "12"}
    # canvas ids from the roster; zed (not in the roster) is never sent
    assert posts["11"] == {"grade_data[101][posted_grade]": "16", "grade_data[102][posted_grade]": "0",
                           "grade_data[103][posted_grade]": "13"}
    assert posts["12"] == {"grade_data[101][posted_grade]": "27.5"}
    assert "sent 3 grade(s) of 01_roofline to assignment 11 (Lab 1): completed" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:Canvas may respond unexpectedly")
def test_canvas_refusal_is_named(tmp_path, capsys, stub_canvas, monkeypatch):
    course = _course(tmp_path, url=stub_canvas)
    monkeypatch.setenv("TEST_CANVAS_TOKEN", "wrong")
    assert lms.main([str(tmp_path / "grades.csv"), "--course", str(course), "--canvas", "--send"]) == 2
    assert "Canvas refused the upload" in capsys.readouterr().err


def test_missing_course_file_is_an_empty_term(tmp_path):
    assert term.load(tmp_path / "none.toml") == term.Term(tmp_path / "none.toml")


def test_shipped_course_file_loads():
    assert term.load().path == term.COURSE_FILE
