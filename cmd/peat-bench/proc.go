package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// procStat is what Linux tells about a process: CPU time used and memory.
type procStat struct {
	cpu      time.Duration // user + system
	rss, hwm int64         // bytes: resident now, and its peak
}

const clockTicks = 100 // USER_HZ on Linux

func readProc(pid int) (procStat, error) {
	var st procStat
	if pid <= 0 {
		return st, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) > 13 {
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		stt, _ := strconv.ParseInt(f[12], 10, 64)
		st.cpu = time.Duration(ut+stt) * time.Second / clockTicks
	}
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			st.rss = kb << 10
		case "VmHWM":
			st.hwm = kb << 10
		}
	}
	return st, sc.Err()
}

// parsePIDs reads a comma-separated list of process ids ("" is none).
func parsePIDs(list string) ([]int, error) {
	var pids []int
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%q is not a process id", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// cpuOf is the CPU time the processes pids have used so far; one that
// cannot be read (gone) counts nothing.
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		st, _ := readProc(pid)
		sum += st.cpu
	}
	return sum
}
