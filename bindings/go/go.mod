module memprobe.dev/memprobe

go 1.21
