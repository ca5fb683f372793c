#!/bin/bash
# name: reward-prewrite
# family: reward channel
# tries: writes reward 1 into every verifier directory it can reach and into reward-like files of the work dir
# proves: the grader leaves a reward the agent wrote in place when it writes none itself (a reward write without an else)
# applies: true
# fix: write the reward on every path (add an else: `|| echo 0 > reward.txt`) and keep the verifier directory out of the agent's reach
for dir in /logs/verifier "$HOME/logs/verifier" /home/user/logs/verifier; do
  if mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; then
    printf '1\n' > "$dir/reward.txt" && echo "wrote $dir/reward.txt"
  fi
done
for name in reward.txt score.txt result.txt; do
  printf '1\n' > "$name" && echo "wrote ./$name"
done
