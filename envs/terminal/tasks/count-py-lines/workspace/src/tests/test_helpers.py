from util.helpers import add


assert add(1, 2) == 3
