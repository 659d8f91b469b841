package logstore

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const mappedTrimSupported = true

// fileRSS is the process's file-backed (and shared) resident memory in
// bytes: the third field of /proc/self/statm, in pages.
func fileRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return 0, fmt.Errorf("/proc/self/statm: %q", b)
	}
	pages, err := strconv.ParseInt(string(f[2]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// pageOutMappings asks the kernel to reclaim the resident pages of every
// shared mapping of a file in dir, and returns how many mappings it asked
// for. A mapping that went away since /proc/self/maps was read is skipped
// (the call fails with ENOMEM, or lands on whatever took its addresses,
// where MADV_PAGEOUT changes no contents either).
func pageOutMappings(dir string) (int, error) {
	maps, err := mappingsIn(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range maps {
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_PAGEOUT)
		switch errno {
		case 0:
			n++
		case unix.ENOMEM, unix.EAGAIN:
		default:
			return n, fmt.Errorf("madvise(MADV_PAGEOUT): %w", errno)
		}
	}
	return n, nil
}

type mapping struct{ start, end uintptr }

// mappingsIn lists the shared mappings of files in dir, from
// /proc/self/maps.
func mappingsIn(dir string) ([]mapping, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, path, ok := parseMapsLine(sc.Text())
		if ok && strings.HasPrefix(path, dir+"/") {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMapsLine reads "start-end perms offset dev inode path" and reports
// ok for a shared mapping of a named file. A deleted file's path ends in
// " (deleted)", which is cut.
func parseMapsLine(line string) (m mapping, path string, ok bool) {
	fields := strings.SplitN(line, " ", 6)
	if len(fields) < 6 || len(fields[1]) < 4 || fields[1][3] != 's' {
		return m, "", false
	}
	lo, hi, found := strings.Cut(fields[0], "-")
	if !found {
		return m, "", false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	path = strings.TrimSuffix(strings.TrimLeft(fields[5], " "), " (deleted)")
	if err1 != nil || err2 != nil || end <= start || !strings.HasPrefix(path, "/") {
		return m, "", false
	}
	return mapping{uintptr(start), uintptr(end)}, path, true
}
