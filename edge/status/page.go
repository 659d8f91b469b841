package status

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"num":       func(v any) string { return FormatCount(toFloat(v)) },
	"bytes":     func(v any) string { return FormatBytes(toFloat(v)) },
	"dur":       FormatDuration,
	"rate":      func(r float64) string { return strconv.FormatFloat(r, 'f', 1, 64) + "/s" },
	"clock":     func(t time.Time) string { return t.UTC().Format("15:04:05") + " UTC" },
	"join":      func(s []string) string { return strings.Join(s, " ") },
	"deref":     deref,
	"retention": FormatRetention,
	"maxlag":    maxLag,
	"spark":     spark,
}).ParseFS(assets, "assets/page.html"))

// Handler serves the status page at "/" and its stylesheet and script
// under "/assets/". get makes the document the page shows; an error is a
// 503 with the error's text.
func Handler(get func() (*Status, error)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		st, err := get()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		var buf bytes.Buffer
		if err := page.Execute(&buf, st); err != nil {
			http.Error(w, "render the status page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(buf.Bytes())
	})
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	mux.HandleFunc("GET /assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, ".css") && !strings.HasSuffix(r.URL.Path, ".js") {
			http.NotFound(w, r) // the template is not an asset
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + r.PathValue("file")
		files.ServeHTTP(w, r2)
	})
	return mux
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	case float64:
		return x
	}
	panic(fmt.Sprintf("status: no number: %T", v)) // a template bug, found by the tests
}

// deref reads an optional number of the document.
func deref(v any) any {
	switch p := v.(type) {
	case *uint64:
		return *p
	case *float64:
		return *p
	}
	panic(fmt.Sprintf("status: not an optional number: %T", v)) // a template bug, found by the tests
}

// FormatCount writes n rounded, with thousands separated by commas, as the
// script's toLocaleString("en-US") does.
func FormatCount(n float64) string {
	s := strconv.FormatFloat(math.Round(n), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// FormatBytes writes n bytes in binary units (1.5 GiB), "off" when negative.
func FormatBytes(n float64) string {
	if n < 0 {
		return "off"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatFloat(n, 'f', 0, 64) + " B"
	}
	return strconv.FormatFloat(n, 'f', 1, 64) + " " + units[i]
}

// FormatDuration writes secs as the two largest units (3h 5m, 2d 4h).
func FormatDuration(secs float64) string {
	s := int64(secs)
	two := func(a int64, ua string, b int64, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s %d%s", a, ua, b, ub)
	}
	switch m, h := s/60, s/3600; {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case m < 60:
		return two(m, "m", s%60, "s")
	case h < 24:
		return two(h, "h", m%60, "m")
	default:
		return two(h/24, "d", h%24, "h")
	}
}

// FormatRetention writes a stream's bounds, "unlimited" when it has none.
func FormatRetention(r Retention) string {
	var parts []string
	if r.MaxAgeSeconds > 0 {
		parts = append(parts, FormatDuration(r.MaxAgeSeconds))
	}
	if r.MaxBytes > 0 {
		parts = append(parts, FormatBytes(float64(r.MaxBytes)))
	}
	if len(parts) == 0 {
		return "unlimited"
	}
	return strings.Join(parts, ", ")
}

// maxLag is the largest lag of groups, in records.
func maxLag(groups []Group) uint64 {
	var m uint64
	for _, g := range groups {
		if g.LagRecords != nil && *g.LagRecords > m {
			m = *g.LagRecords
		}
	}
	return m
}

// Sparkline geometry, shared with status.js (points).
const (
	sparkWidth  = 120
	sparkHeight = 32
)

// spark draws vals as an inline SVG line, the top at the largest value
// (at least 1, so a quiet node draws a flat line at the bottom).
func spark(vals []float64, name string) template.HTML {
	return template.HTML(fmt.Sprintf(`<svg class="spark" data-spark="%s" viewBox="0 0 %d %d" preserveAspectRatio="none" role="img" aria-label="%s, last %d points"><polyline points="%s"/></svg>`,
		template.HTMLEscapeString(name), sparkWidth, sparkHeight, template.HTMLEscapeString(name), len(vals), sparkPoints(vals)))
}

func sparkPoints(vals []float64) string {
	if len(vals) == 0 {
		return ""
	}
	top := 1.0
	for _, v := range vals {
		top = max(top, v)
	}
	step := 0.0
	if len(vals) > 1 {
		step = float64(sparkWidth) / float64(len(vals)-1)
	}
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", float64(i)*step, float64(sparkHeight-1)-float64(sparkHeight-2)*v/top)
	}
	return b.String()
}
