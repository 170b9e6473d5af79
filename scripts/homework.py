"""Grade your exercises/ for one session and print a report to paste into Discord.

    python scripts/homework.py 2            # session 2's exercises; N for session N
    python scripts/homework.py bugs         # the find-the-bug set
    python scripts/homework.py all          # every set
    python scripts/homework.py 2 --solutions   # instructors: grade solutions/
    python scripts/homework.py 2 --post --webhook URL   # and post it (or DISCORD_WEBHOOK_URL)

It runs the session's tests (tests/test_exercises/) against exercises/ in a
fresh pytest process, then prints, under a title that names the session, one
line per exercise: pass; fail, with the test's words (the case, your number
against the expected one in its unit) and the hint from the exercise's
docstring; or not started; the numbers an exercise measured; and the machine
it ran on (on a CPU, its cores and the devices simulated on them). A
Discord message holds 2,000 characters, so a longer report is split into
numbered parts, each to be pasted as one message; --post sends them, in order,
through the course's Discord webhook (scripts/harness/discord.py). Exit status 0
only when every exercise passes; 2 when posting fails or is refused.
"""

import argparse
import os
import sys

from scripts.harness import discord, grading


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="homework.py",
        description="Grade exercises/ and print a Discord-sized Markdown report.",
    )
    parser.add_argument("session", help=f"one of {', '.join(grading.SESSIONS)}, or all")
    parser.add_argument(
        "--solutions",
        action="store_true",
        help="grade solutions/ instead (instructors: they must all pass)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("--verbose", action="store_true", help="show pytest's own output too")
    parser.add_argument("--post", action="store_true", help="post the report to Discord")
    parser.add_argument(
        "--webhook",
        metavar="URL",
        help="Discord webhook URL for --post (default: $DISCORD_WEBHOOK_URL)",
    )
    args = parser.parse_args(argv)

    sessions = grading.session_names(args.session)
    if sessions is None:
        print(
            f"homework.py: unknown session '{args.session}' "
            f"(sessions: {', '.join(grading.SESSIONS)}, all)",
            file=sys.stderr,
        )
        return 2
    webhook = args.webhook or os.environ.get("DISCORD_WEBHOOK_URL")
    if args.post:  # a missing or wrong URL is said before minutes of grading, not after
        try:
            if not webhook:
                raise discord.PostError("--post needs --webhook URL or DISCORD_WEBHOOK_URL")
            discord.check_url(webhook)
        except discord.PostError as e:
            print(f"homework.py: {e}", file=sys.stderr)
            return 2
    elif args.webhook:
        print("homework.py: --webhook without --post: nothing will be posted", file=sys.stderr)

    root, output = grading.run_tests(sessions, args.solutions, args.timeout, args.verbose)
    machine, exercises = grading.results(root) if root is not None else ({}, {})
    if not exercises:
        tail = "\n".join(output.strip().splitlines()[-15:])
        print(f"homework.py: the tests did not run:\n{tail}", file=sys.stderr)
        return 1

    blocks = grading.report_blocks(sessions, machine, exercises, args.solutions)
    parts = grading.split_parts(grading.report_title(sessions), blocks)
    print(f"\n{grading.SEPARATOR}\n".join(parts), flush=True)
    if args.post:

        def log(line):
            print(f"homework.py: {line}", file=sys.stderr)

        try:
            sent = discord.post_parts(webhook, parts, log=log)
        except discord.PostError as e:
            log(f"posting failed: {e}")
            return 2
        log(f"posted {sent} part(s) to {discord.mask(webhook)}")
    return 0 if all(e["status"] == "pass" for e in exercises.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
