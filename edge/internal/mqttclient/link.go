package mqttclient

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"time"
)

// Link is the life of one client connection, as the MQTT source kinds
// keep it: writes under one lock, each flushed within a deadline (a black
// hole with full socket buffers fails the connection), and an end the
// first failure decides. The connection's goroutines are counted in WG;
// Close waits for them.
type Link struct {
	nc      net.Conn
	timeout time.Duration

	wmu sync.Mutex // guards bw and every write
	bw  *bufio.Writer

	done    chan struct{} // closed by Fail (Ended)
	once    sync.Once
	err     error
	WG      sync.WaitGroup
	closing sync.Once
}

// NewLink starts the life of nc, whose writes each get timeout.
func NewLink(nc net.Conn, timeout time.Duration) *Link {
	return &Link{nc: nc, timeout: timeout, bw: bufio.NewWriterSize(nc, 4096), done: make(chan struct{})}
}

// Fail ends the connection with err (the first one wins) and closes the
// socket.
func (l *Link) Fail(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.done)
		_ = l.nc.Close()
	})
}

// Ended is closed once the connection failed or closed; Err then says why.
func (l *Link) Ended() <-chan struct{} { return l.done }

// Err is why the connection ended; read it once Ended is closed.
func (l *Link) Err() error { return l.err }

// Close ends the connection and waits for its goroutines.
func (l *Link) Close() error {
	l.closing.Do(func() {
		l.Fail(errors.New("closed"))
		l.WG.Wait()
	})
	return nil
}

// Write writes b and flushes it; a failure ends the connection.
func (l *Link) Write(b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.nc.SetWriteDeadline(time.Now().Add(l.timeout))
	if _, err := l.bw.Write(b); err != nil {
		l.Fail(err)
		return err
	}
	if err := l.bw.Flush(); err != nil {
		l.Fail(err)
		return err
	}
	return nil
}
