/* SPDX-License-Identifier: MIT */
/*
 * altdump_mixed: one program linking a format-3 object (mixed_a.c, first)
 * and a format-1 object (mixed_b.c). The linker keeps one note, the first
 * object's: altpatch_apply() patches mixed_a()'s site and leaves
 * mixed_b()'s original in place (both run correctly either way). Prints
 * "mixed a=A b=B" and exits 0 when A is 2 and B is 1 after apply.
 */
#include <stdio.h>

#include <altpatch/altpatch.h>

int mixed_a(void);
int mixed_b(void);

int main(void)
{
    if (mixed_a() != 1 || mixed_b() != 1) {
        fprintf(stderr, "mixed: originals wrong before apply\n");
        return 1;
    }
    int rc = altpatch_apply();
    int a = mixed_a(), b = mixed_b();
    printf("mixed rc=%d a=%d b=%d\n", rc, a, b);
    return rc == 0 && a == 2 && b == 1 ? 0 : 1;
}
