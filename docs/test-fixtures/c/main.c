/* docs-test fixture: a block of statements, run as the body of main. */
#include <stdint.h>
#include <stdio.h>
#include "memprobe.h"
/* docs-test: includes */

int main(void) {
    /* docs-test: block */
    return 0;
}
