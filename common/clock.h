/* common/clock.h — the monotonic clock in milliseconds and a sleep that survives
 * signals: what every wait loop with a deadline needs. */
#ifndef SMELT_COMMON_CLOCK_H
#define SMELT_COMMON_CLOCK_H

#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC (not wall time: deadlines survive clock changes). */
int64_t mono_ms(void);
/* Sleeps ms milliseconds, resuming after a signal interrupts it. */
void sleep_ms(int64_t ms);

#endif
