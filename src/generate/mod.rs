//! The batch generation job: input reader, dispatcher, journal/resume, progress, watchdog.
