# Shared by every step's test.sh: the reward from a check's exit status.
grade() {
  if "$@"; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
}
