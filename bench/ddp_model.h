/* `kiln bench ddp --model-scaling` (bench/ddp_model.c): a cost model of
 * data-parallel training fitted on this machine and used to predict
 * scaling past it. */
#ifndef KILN_BENCH_DDP_MODEL_H
#define KILN_BENCH_DDP_MODEL_H

/* What `kiln bench ddp` measured (medians of its rounds). */
typedef struct ddp_model_measured {
    int ranks, batch, threads, rounds;
    double img_s_1, img_s_n; /* 1 process; `ranks` ranks under DDP, all together */
    double hidden;           /* share of all-reduce time inside backward, rank 0; < 0: not measured */
    double backward_ms;      /* backward per step at `ranks` */
    double allreduce_ms;     /* all-reduce per step at `ranks`, start to seen complete */
    const char *cpu;
    const char *exe, *mpirun; /* for the ping-pong job */
} ddp_model_measured;

/* Runs the ping-pong (`mpirun -np 2 kiln bench ddp --pingpong`), times
 * both models' steps in this process, fits the model, checks it against
 * `m` and prints the predictions (table, then one JSON line). 0, or 1
 * with the reason on stderr. Blocks for the whole run (tens of seconds). */
int ddp_model_scaling(const ddp_model_measured *m);

/* The ping-pong worker (rank 0 and 1 of an mpirun job): one-way times of
 * MPI_Send/MPI_Recv from 8 B to 32 MiB; rank 0 prints its RESULT line. */
int ddp_pingpong_worker(void);

#endif
