/* Registration of the diag layer's anomaly hook with the dispatcher. */
#ifndef KILN_SRC_DIAG_ANOMALY_H
#define KILN_SRC_DIAG_ANOMALY_H

/* Register anomaly mode's check as the dispatcher's anomaly hook (kiln_init). */
void kiln_anomaly_init(void);

#endif
