/* kiln train: the main job (see tools/train.c). */
#ifndef KILN_TOOLS_TRAIN_H
#define KILN_TOOLS_TRAIN_H

/* argv holds the options after "train". Returns the process exit code:
 * 0 done, 1 a library error (printed), 2 a usage error. */
int kiln_cmd_train(int argc, char **argv);

#endif
