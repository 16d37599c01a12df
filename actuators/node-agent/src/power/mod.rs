//! CPU P-states: the cpufreq sysfs backend and the X-MAN power manager (domain.md §5).
