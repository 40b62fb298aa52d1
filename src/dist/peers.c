/* Which rank is lost: the ranks' processes, exchanged at kiln_dist_init,
 * and a liveness check of those on this host.
 *
 * MPI does not say which rank of a collective is missing, and Open MPI's
 * shared-memory transport never notices that a peer died: a collective with
 * a dead rank simply never completes. So at init every rank all-gathers who
 * it is (pid, process start time, host name, pid namespace), and a wait
 * that has not completed looks, every DIST_PEER_CHECK_S, whether the
 * processes of the other ranks on this host still exist. A rank whose
 * process has exited (no /proc/<pid>, a zombie, or another process under
 * its pid) is named at once instead of after the watchdog's full timeout.
 * Ranks on other hosts (or in another pid namespace) cannot be looked at
 * from here; for them the watchdog remains the bound. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "dist/dist_internal.h"

#if KILN_WITH_MPI

/* The fields of /proc/<pid>/stat this needs: the state letter and the
 * start time (clock ticks after boot; field 22). False when the process
 * does not exist (or the file does not parse). */
static bool proc_stat(int pid, char *state, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: parse after the last ')'. */
    const char *p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %c", state) != 1) return false;
    /* Fields 3..22: state is field 3, start time field 22, 19 fields further. */
    const char *q = p + 1;
    for (int field = 3; field < 22 && q; field++) {
        q = strchr(q + 1, ' ');
    }
    return q && sscanf(q, " %llu", start) == 1;
}

/* This host's key: the host name and the pid namespace (two containers
 * with one host name see different processes under one pid). */
static void host_key(dist_peer *me) {
    if (gethostname(me->host, sizeof me->host) != 0) snprintf(me->host, sizeof me->host, "?");
    me->host[sizeof me->host - 1] = '\0';
    struct stat sb;
    me->pid_ns = stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

kiln_status kiln_dist_peers_exchange(kiln_dist_group *g) {
    dist_peer me;
    memset(&me, 0, sizeof me);
    me.pid = (int32_t)getpid();
    char state;
    unsigned long long start = 0;
    me.start_ticks = proc_stat(me.pid, &state, &start) ? start : 0;
    host_key(&me);
    dist_peer *all = KILN_CALLOC((size_t)g->world, sizeof *all);
    if (!all) return KILN_ERR_OUT_OF_MEMORY;
    int rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, g->comm);
    if (rc != MPI_SUCCESS) {
        free(all);
        char text[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(rc, text, &len);
        return KILN_RAISE(KILN_ERR_DEVICE, "check that every rank was started by the same mpirun",
                          "kiln_dist_init: MPI_Allgather of the ranks' processes failed: %s (MPI error %d)",
                          text, rc);
    }
    g->peers = all;
    return KILN_OK;
}

/* Whether rank r's process is known to be gone. */
static bool peer_lost(const kiln_dist_group *g, int r) {
    const dist_peer *me = &g->peers[g->rank], *p = &g->peers[r];
    if (strcmp(me->host, p->host) || me->pid_ns != p->pid_ns || !me->pid_ns || !p->start_ticks) return false;
    char state = '?';
    unsigned long long start = 0;
    if (!proc_stat(p->pid, &state, &start)) return true;
    return state == 'Z' || state == 'X' || start != p->start_ticks;
}

int kiln_dist_peers_lost(const kiln_dist_group *g, char *buf, size_t size) {
    buf[0] = '\0';
    if (!g->peers) return 0;
    int lost = 0;
    size_t used = 0;
    for (int r = 0; r < g->world; r++) {
        if (r == g->rank || !peer_lost(g, r)) continue;
        if (used + 96 < size) {
            int k = snprintf(buf + used, size - used, "%srank %d (pid %d on %s)", lost ? ", " : "", r,
                             (int)g->peers[r].pid, g->peers[r].host);
            if (k > 0) used += (size_t)k;
        }
        lost++;
    }
    return lost;
}

#endif
