#!/bin/bash
cat > greet.sh <<SCRIPT
#!/bin/bash
echo "${GREETING_WORD} from \${GREETER_PROJECT}!"
SCRIPT
chmod +x greet.sh
