package demo

import (
	"os"

	"gonum.org/v1/plot/vg"
)

func writeFile(path string, c vg.CanvasWriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
