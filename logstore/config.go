package logstore

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Durability says when an append is acknowledged.
type Durability string

const (
	// DurabilityFsync acknowledges an append once its group commit is
	// fsynced (Badger SyncWrites).
	DurabilityFsync Durability = "fsync"
	// DurabilityInterval acknowledges an append once it is written; the
	// store fsyncs every SyncInterval.
	DurabilityInterval Durability = "interval"
)

// Defaults.
const (
	DefaultStreamName        = "default"
	DefaultMaxAge            = 7 * 24 * time.Hour
	DefaultSyncInterval      = 100 * time.Millisecond
	DefaultLinger            = time.Duration(0)
	DefaultLingerQoS0        = 5 * time.Millisecond
	MaxLinger                = time.Second // a longer wait for an ack is a misconfiguration
	DefaultRetentionInterval = 30 * time.Second
	DefaultReclaimInterval   = time.Minute
)

// StreamConfig describes one stream.
type StreamConfig struct {
	Name         string
	Filters      []string      // MQTT topic filters this stream captures
	MaxAge       time.Duration // retention by age; 0 = unlimited
	MaxBytes     int64         // retention by size, compared with Stream.Bytes (encoded keys and values); 0 = unlimited
	Durability   Durability    // "" means fsync
	SyncInterval time.Duration // for interval durability: fsync period (default 100ms)
	// Linger paces group commits: an append that arrives within Linger of
	// the previous commit's start waits for the rest of it, so that all
	// arriving meanwhile share one commit (and fsync); one that arrives
	// after a quiet Linger commits at once. 0 commits at once. It adds up
	// to Linger to an acknowledgement under load, nothing on a quiet
	// stream (see Stream.linger).
	Linger time.Duration
	// LingerQoS0 is the same for an append whose records are all QoS 0:
	// no publisher waits for those, so only their delivery is later, by
	// at most LingerQoS0, and a commit (with its fsync) is shared by every
	// QoS 0 publish that arrives meanwhile. 0 commits at once.
	LingerQoS0 time.Duration
	// Mirror marks a copy of another node's stream (edge/mirror): its
	// offsets are the source's, so publishes its filters route to it are
	// refused (mqtt ingest); the filters say what readers reach it by, and
	// may be left out.
	Mirror bool
}

// Config configures a Store.
type Config struct {
	Dir               string
	InMemory          bool    // badger in-memory mode, for tests
	Profile           Profile // "" = DefaultProfile()
	Streams           []StreamConfig
	Logger            *slog.Logger  // nil = discard; Badger's warnings and errors are bridged into it
	Metrics           *Metrics      // nil = fresh unregistered
	RetentionInterval time.Duration // how often retention is checked (default 30s)
	// ManualCommit false (single node): Committed() follows the durable log
	// end. true: only SetHighWatermark moves it (cluster), and it is
	// persisted, so a restart opens with the last one readers saw.
	ManualCommit bool

	// ReclaimInterval is the minimum time between two DropPrefix calls,
	// which block every writer of the store while they run (default 1m).
	ReclaimInterval time.Duration
	// MinFreeBytes refuses appends with ErrNoSpace while the filesystem
	// holding Dir has less free space than this. Badger writes through
	// sparse memory-mapped files, and a write fault there kills the process
	// instead of returning an error, so the reserve must cover a memtable
	// and a value log file. 0 = the profile's reserve scaled to the
	// filesystem (Profile.Reserve), negative = no check.
	MinFreeBytes int64
	// FreeSpace reports the bytes free (to unprivileged users) and the
	// size of the filesystem holding dir; nil is statfs. For platforms
	// without statfs, and for tests.
	FreeSpace func(dir string) (free, size uint64, err error)
	// MappedLimit bounds the part of the process's RSS that is pages of
	// Badger's memory-mapped files: past it, the store hands them back to
	// the kernel (mapped.go; Linux only). 0 = the profile's default,
	// negative = never.
	MappedLimit int64

	tune       func(*profileSpec) // tests: changes the profile's options before Open uses them
	batchValue int                // tests: caps a batch's value below maxBatchValue (1: every record its own entry, as in key layout 2)
}

// DefaultConfig is one stream "default" capturing "#", fsync durability,
// retained for 7 days, data in ./data.
func DefaultConfig() Config {
	return Config{
		Dir: "data",
		Streams: []StreamConfig{{
			Name:       DefaultStreamName,
			Filters:    []string{"#"},
			MaxAge:     DefaultMaxAge,
			Durability: DurabilityFsync,
		}},
		RetentionInterval: DefaultRetentionInterval,
	}
}

// Validate reports every problem in c, each naming its field, joined in one
// error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Dir == "" && !c.InMemory {
		add("dir", "required unless in-memory")
	}
	if err := c.Profile.Validate(); err != nil {
		add("profile", "%v", err)
	}
	if c.RetentionInterval < 0 {
		add("retention_interval", "must not be negative, got %v", c.RetentionInterval)
	}
	if c.ReclaimInterval < 0 {
		add("reclaim_interval", "must not be negative, got %v", c.ReclaimInterval)
	}
	names := map[string]int{}
	filters := map[string]string{} // filter -> field that first declared it
	for i, sc := range c.Streams {
		p := fmt.Sprintf("streams[%d]", i)
		if err := validateStreamName(sc.Name); err != nil {
			add(p+".name", "%v", err)
		} else if j, dup := names[sc.Name]; dup {
			add(p+".name", "duplicate stream name %q (also streams[%d])", sc.Name, j)
		} else {
			names[sc.Name] = i
		}
		if !sc.Mirror && len(sc.Filters) == 0 {
			add(p+".filters", "at least one topic filter is required")
		}
		for k, f := range sc.Filters {
			fp := fmt.Sprintf("%s.filters[%d]", p, k)
			if err := validateFilter(f); err != nil {
				add(fp, "%v", err)
				continue
			}
			if other, dup := filters[f]; dup {
				add(fp, "filter %q is also captured by %s", f, other)
				continue
			}
			filters[f] = fp
		}
		if sc.MaxAge < 0 {
			add(p+".max_age", "must not be negative, got %v", sc.MaxAge)
		}
		if sc.MaxBytes < 0 {
			add(p+".max_bytes", "must not be negative, got %d", sc.MaxBytes)
		}
		switch sc.Durability {
		case "", DurabilityFsync, DurabilityInterval:
		default:
			add(p+".durability", "unknown durability %q, want %q or %q", sc.Durability, DurabilityFsync, DurabilityInterval)
		}
		if sc.SyncInterval < 0 {
			add(p+".sync_interval", "must not be negative, got %v", sc.SyncInterval)
		}
		if sc.Linger < 0 || sc.Linger > MaxLinger {
			add(p+".linger", "must be between 0 and %v, got %v", MaxLinger, sc.Linger)
		}
		if sc.LingerQoS0 < 0 || sc.LingerQoS0 > MaxLinger {
			add(p+".qos0_linger", "must be between 0 and %v, got %v", MaxLinger, sc.LingerQoS0)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// validateStreamName allows names that are safe in topics, metrics labels
// and file names: 1-64 of [A-Za-z0-9_.-].
func validateStreamName(name string) error {
	if name == "" {
		return errors.New("required")
	}
	if len(name) > 64 {
		return fmt.Errorf("%q is longer than 64 bytes", name)
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.'
		if !ok {
			return fmt.Errorf("%q: only letters, digits, '_', '-' and '.' are allowed", name)
		}
	}
	return nil
}

// validateFilter checks a stream's topic filter: a valid MQTT filter
// (ValidateFilter) that is not a shared subscription.
func validateFilter(f string) error {
	if err := ValidateFilter(f); err != nil {
		return err
	}
	if strings.HasPrefix(f, "$share/") || strings.HasPrefix(f, "$SHARE/") {
		return fmt.Errorf("topic filter %q: shared subscriptions cannot be captured", f)
	}
	return nil
}

// durability returns the effective durability ("" means fsync).
func (sc StreamConfig) durability() Durability {
	if sc.Durability == "" {
		return DurabilityFsync
	}
	return sc.Durability
}

func (sc StreamConfig) syncInterval() time.Duration {
	if sc.SyncInterval <= 0 {
		return DefaultSyncInterval
	}
	return sc.SyncInterval
}
