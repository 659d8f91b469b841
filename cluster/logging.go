package cluster

import (
	"bytes"
	"context"
	"log/slog"
)

// logWriter bridges Serf's, memberlist's and Raft's line loggers into
// slog: each writes "[LEVEL] component: message" lines (hclog with
// DisableTime, the standard logger with no flags), so the level is read
// off the bracket. DEBUG and TRACE lines are dropped.
type logWriter struct {
	log *slog.Logger
}

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		level, msg := slog.LevelInfo, line
		if i := bytes.IndexByte(line, '['); i >= 0 {
			if j := bytes.IndexByte(line[i:], ']'); j > 0 {
				switch string(line[i+1 : i+j]) {
				case "ERR", "ERROR":
					level = slog.LevelError
				case "WARN":
					level = slog.LevelWarn
				case "DEBUG", "TRACE":
					continue
				}
				msg = bytes.TrimSpace(line[i+j+1:])
			}
		}
		w.log.Log(context.Background(), level, string(msg))
	}
	return len(p), nil
}
