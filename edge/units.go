package edge

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as "100ms", "168h" or "7d"
// (a day is 24 hours). A bare 0 is also accepted.
type Duration time.Duration

// ParseDuration parses what Duration accepts.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n*24 > float64(math.MaxInt64/int64(time.Hour)) {
			return 0, fmt.Errorf("%q is not a duration like 100ms, 168h or 7d", s)
		}
		return time.Duration(n * 24 * float64(time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like 100ms, 168h or 7d", s)
	}
	return d, nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return lineError(n, "want a duration like 100ms, 168h or 7d")
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return lineError(n, err.Error())
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func (d Duration) String() string {
	td := time.Duration(d)
	if td != 0 && td%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(td/(24*time.Hour)), 10) + "d"
	}
	return td.String()
}

// ByteSize is a number of bytes written in YAML as a plain integer or with
// a unit: "512KiB", "64MiB", "1GiB", "10GB" (KB, MB, GB, TB are powers of
// 1000; KiB, MiB, GiB, TiB powers of 1024). Only a plain integer may be
// negative (for fields where -1 means "off").
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// ParseByteSize parses what ByteSize accepts.
func ParseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	num := s
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || (n < 0 && mult != 1) || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size like 1048576, 512KiB or 64MiB", s)
	}
	return n * mult, nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return lineError(n, "want a size like 1048576, 512KiB or 64MiB")
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return lineError(n, err.Error())
	}
	*b = ByteSize(v)
	return nil
}

// lineError is a decoding error yaml collects with the others (a
// *yaml.TypeError), placed by line and column so Parse can name the field.
func lineError(n *yaml.Node, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d column %d: %s", n.Line, n.Column, msg)}}
}
