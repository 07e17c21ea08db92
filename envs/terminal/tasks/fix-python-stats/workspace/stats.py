"""Print count, mean and median of the numbers in a file (one number per line)."""
import sys


def read_numbers(path):
    with open(path) as f:
        lines = f.read().split("\n")
    return [float(lines[i]) for i in range(1, len(lines))]


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    numbers = read_numbers(sys.argv[1])
    mean = sum(numbers) // len(numbers)
    print(f"count={len(numbers)} mean={mean:.2f} median={median(numbers):.2f}")


if __name__ == "__main__":
    main()
