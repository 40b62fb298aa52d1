/* `kiln plan` (tools/plan.c) and the pieces `kiln bench plan` shares. */
#ifndef KILN_TOOLS_PLAN_COMMAND_H
#define KILN_TOOLS_PLAN_COMMAND_H

#include <stdbool.h>

#include "kiln/kiln.h"

/* kiln plan [flags]: argv[0] is the first argument after "plan". Returns
 * the exit code (2 for a bad flag, with a message naming it). */
int kiln_cmd_plan(int argc, char **argv);
/* --amp: off, on (bf16 on the CPU, f16 on CUDA), f16, bf16. */
bool plan_parse_amp(const char *s, kiln_device dev, kiln_dtype *out);
/* "off", "f16", "bf16". */
const char *plan_amp_name(kiln_dtype amp);
/* The human table of a plan, and its memories as a JSON member. */
void plan_print(const kiln_plan *p);
void plan_print_json_memories(const kiln_plan *p);

#endif
