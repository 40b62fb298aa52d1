/* The README's first program: kept compiling and running by the tests. */
#include <stdio.h>
#include <stdlib.h>

#include <kiln/kiln.h>

int main(void) {
    if (kiln_init()) return 1;
    kiln_scope_begin();                           /* owns what the calls below return */
    kiln_tensor *x = kiln_randn(KILN_SHAPE(64, 128), KILN_F32, kiln_default_device());
    kiln_tensor *h = kiln_to(x, KILN_CPU, KILN_F16, 0);
    double first;
    if (!x || !h || kiln_item(kiln_narrow(kiln_view(h, KILN_SHAPE(-1)), 0, 0, 1), &first)) {
        fprintf(stderr, "kiln: %s\n", kiln_error_message());   /* names the thing and the fix */
        return 1;
    }
    printf("first element as f16: %g\n", first);   /* kiln_item blocks until it is known */
    kiln_scope_end();                             /* releases x, h and the views */
    char *summary = kiln_memory_summary(KILN_CPU, true);
    puts(summary);
    free(summary);
    kiln_shutdown();
}
