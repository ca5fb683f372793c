#!/bin/bash
printf '#!/bin/bash\necho "Hello, $1!"\n' > greet.sh
