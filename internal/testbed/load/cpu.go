package load

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat CPU times.
// It is 100 on every architecture Go supports on Linux; reading sysconf
// would need cgo.
const clockTicks = 100

// ProcCPU samples the CPU time (user + system) of process pid from
// /proc/<pid>/stat.
func ProcCPU(pid int) CPUSampler {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	return func() (float64, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
		// The command name (field 2) is in parentheses and may hold
		// spaces: count fields after the last ')'. Field 3 (state) is
		// index 0 there, so utime (14) and stime (15) are 11 and 12.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			return 0, fmt.Errorf("parse %s: no command name", path)
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			return 0, fmt.Errorf("parse %s: %d fields after the command name", path, len(f))
		}
		ut, err1 := strconv.ParseUint(f[11], 10, 64)
		st, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("parse %s: utime %q stime %q", path, f[11], f[12])
		}
		return float64(ut+st) / clockTicks, nil
	}
}

// MetricsCPU samples process_cpu_seconds_total from a Prometheus endpoint
// (the picker's /metrics at addr "host:port").
func MetricsCPU(addr string) CPUSampler {
	page := launch.PageAt(addr)
	return func() (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, err := page.Scrape(ctx)
		if err != nil {
			return 0, err
		}
		v, ok := m.Sum("process_cpu_seconds_total")
		if !ok {
			return 0, fmt.Errorf("%s has no process_cpu_seconds_total", page)
		}
		return v, nil
	}
}

// selfCPU is this process's CPU seconds (user + system).
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}
