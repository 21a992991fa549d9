"""``python -m course_lib <command>``. Commands: ``doctor`` (environment and artifact report)."""
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m course_lib doctor [--convert]")
        return 0 if argv else 2
    if argv[0] == "doctor":
        from .doctor import main as doctor
        return doctor(argv[1:])
    print(f"unknown command {argv[0]!r}; usage: python -m course_lib doctor [--convert]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
