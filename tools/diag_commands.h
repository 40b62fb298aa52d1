/* `kiln smi` and `kiln memory`: the diag layer's subcommands. */
#ifndef KILN_TOOLS_DIAG_COMMANDS_H
#define KILN_TOOLS_DIAG_COMMANDS_H

/* kiln smi [--watch SEC] [--count N]: argv[0] is the first argument after
 * "smi". Returns the exit code. */
int kiln_cmd_smi(int argc, char **argv);
/* kiln memory [DEVICE]: kiln_memory_summary of DEVICE (default cpu). */
int kiln_cmd_memory(int argc, char **argv);

#endif
