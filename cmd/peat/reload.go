package main

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/peatmq/peat/edge"
)

// reloadOnHangup reloads the node's users, ACL and tokens files and TLS
// certificates on each SIGHUP
// (systemctl reload peat) until the returned stop is called. A failed
// reload keeps the rules in force; the node logs why. Without the
// handler, SIGHUP would end the process.
func reloadOnHangup(node *edge.Node, logger *slog.Logger) (stop func()) {
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-hups:
				if err := node.Reload(); errors.Is(err, edge.ErrNoAuth) {
					logger.Info("SIGHUP: nothing to reload (no users, ACL or tokens file, no TLS certificate)")
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hups)
		close(done)
		<-finished
	}
}
