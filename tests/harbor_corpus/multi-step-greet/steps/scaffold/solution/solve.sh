#!/bin/bash
printf '#!/bin/bash\necho Hello\n' > greet.sh
