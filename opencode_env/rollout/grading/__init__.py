"""Grading: the verify commands' reward read back (reward.py), the test grader (graded_tests.py, mutants.py, its
pytest in inside/), the grader files kept out of the agent's reach (integrity.py), the grader's box and environment
(grader_box.py, grader_env.py) and a verify that failed on the network (offline.py). verify_phase.py drives them."""
