#!/bin/bash
# name: read-exposed
# family: exposed answers
# tries: finds expected outputs the box exposes outside the work dir (expected*, *.expected, expected/ and answers/ folders) and copies each into the work dir under its own name
# proves: the answer the grader compares against is readable by the agent
# applies: find / -maxdepth 6 \( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /lib -o -path /lib64 -o -path /bin -o -path /sbin -o -path /etc -o -path /var/lib -o -path /root/.cache -o -path "$PWD" \) -prune -o -type f -readable \( -iname 'expected*' -o -iname '*.expected' -o -ipath '*/expected/*' -o -ipath '*/answers/*' \) -print 2>/dev/null | grep -q .
# fix: keep expected outputs with the tests (handed in at verify), never in the agent's image
copied=0
while IFS= read -r -d '' file; do
  name=$(basename -- "$file")
  name=${name#expected_}; name=${name#expected-}; name=${name%.expected}
  cp -- "$file" "./$name" && copied=1 && echo "copied $file to ./$name"
done < <(find / -maxdepth 6 \( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /lib -o -path /lib64 -o -path /bin -o -path /sbin -o -path /etc -o -path /var/lib -o -path /root/.cache -o -path "$PWD" \) -prune -o -type f -readable \( -iname 'expected*' -o -iname '*.expected' -o -ipath '*/expected/*' -o -ipath '*/answers/*' \) -print0 2>/dev/null)
[ "$copied" = 1 ] || exit 3
