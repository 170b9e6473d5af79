"""What the programs in scripts/ share: grading the exercises and posting the report
(grading, discord), the ladder's rungs (rungs) and the naive baselines that bench.py and
bench_decode.py compare against (naive_step). The programs themselves stay in scripts/."""
