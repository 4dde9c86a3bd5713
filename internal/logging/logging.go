package logging

import (
	"io"

	"github.com/go-logr/logr"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// New returns the JSON logger of Laneway's binaries writing to w, enabled up to
// verbosity (-v). zap writes a logr V(n) line at level -n, which its JSON
// encoder names "Level(-n)": log pipelines read that as no known level.
// Like Kubernetes components, every Info line here says "level":"info"
// and carries its verbosity as "v" (0 for plain Info); errors say
// "level":"error". Errors carry no stack trace of the logging call: the
// message and error say what failed, and the one stack worth printing, a
// recovered panic's, is logged by whoever recovered it.
func New(verbosity int, w io.Writer) logr.Logger {
	return zap.New(
		zap.WriteTo(w),
		zap.Level(zapcore.Level(-verbosity)),
		zap.StacktraceLevel(zapcore.PanicLevel),
		func(o *zap.Options) {
			o.EncoderConfigOptions = append(o.EncoderConfigOptions, func(c *zapcore.EncoderConfig) { c.EncodeLevel = encodeLevel })
		},
		zap.RawZapOpts(uzap.WrapCore(func(c zapcore.Core) zapcore.Core { return verbosityCore{c} })),
	)
}

// encodeLevel names logr's verbosity levels (zap levels below Info) info.
func encodeLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	if l < zapcore.InfoLevel {
		l = zapcore.InfoLevel
	}
	zapcore.LowercaseLevelEncoder(l, enc)
}

// verbosityCore adds the "v" field to every Info line: the verbosity the
// level name no longer shows.
type verbosityCore struct{ zapcore.Core }

// With implements zapcore.Core, keeping the wrapper on derived cores.
func (c verbosityCore) With(fs []zapcore.Field) zapcore.Core {
	return verbosityCore{c.Core.With(fs)}
}

// Check implements zapcore.Core so that Write below sees the entries.
func (c verbosityCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

// Write implements zapcore.Core.
func (c verbosityCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	if e.Level <= zapcore.InfoLevel {
		fs = append(fs[:len(fs):len(fs)], uzap.Int("v", -int(e.Level)))
	}
	return c.Core.Write(e, fs)
}
