"""`opencode-env audit`: which reward hacks each task of a dataset admits, played against the task's own grader in
its native layout and under our default grading."""
