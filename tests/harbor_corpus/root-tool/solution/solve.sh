#!/bin/bash
set -e
cat > /usr/local/bin/wordcount <<'SCRIPT'
#!/bin/sh
wc -w | tr -d ' '
SCRIPT
chmod 755 /usr/local/bin/wordcount
